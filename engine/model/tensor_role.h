// TensorRole: what a parameter tensor is, the one vocabulary of tensor kinds for the layout
// (engine/model), the executor's per-layer weight tables and fragment plans (engine/exec) and
// the trainer. A decoder layer's roles come first, so they index a layer's tables directly.
#pragma once

namespace megatrain::engine {

enum class TensorRole : int {
  // A decoder layer's tensors, in their packed order (0 .. kLayerTensorCount - 1).
  kInputNorm,
  kQ,
  kQBias,
  kQNorm,  // qwen3: RMSNorm weight over head_dim, shared by every query head
  kK,
  kKBias,
  kKNorm,  // qwen3: the same for every key head
  kV,
  kVBias,
  kO,
  kOBias,
  kPostAttentionNorm,
  kGate,
  kGateBias,
  kUp,
  kUpBias,
  kDown,
  kDownBias,
  // The tensors outside the layers.
  kEmbedding,
  kFinalNorm,
  kLmHead,
};
inline constexpr int kLayerTensorCount = static_cast<int>(TensorRole::kDownBias) + 1;
inline constexpr int kNumTensorRoles = static_cast<int>(TensorRole::kLmHead) + 1;

}  // namespace megatrain::engine
