// ParameterLayout: how a model's tensors pack into one contiguous fp32 buffer per entry.
//
// Entries, in order: the embedding, layers 0..L-1, the final norm, and the LM
// head (only when the embeddings are untied). Each entry is one fp32 buffer
// holding its tensors back to back in a fixed order; every tensor starts at a
// multiple of kTensorAlignmentFloats (16 floats = 64 bytes) so SIMD segments
// start aligned, and the entry's length is rounded up to the same multiple.
// Padding floats are zero and are never parameters.
//
// Packed order of a decoder layer (biases and q/k norms present only when configured):
//    1 input_layernorm.weight           [d]
//    2 self_attn.q_proj.weight          [Hq*D, d]
//    3 self_attn.q_proj.bias            [Hq*D]      qkv bias (llama/qwen3 attention_bias, qwen2)
//    4 self_attn.q_norm.weight          [D]         qwen3: RMSNorm of each query head
//    5 self_attn.k_proj.weight          [Hkv*D, d]
//    6 self_attn.k_proj.bias            [Hkv*D]     qkv bias
//    7 self_attn.k_norm.weight          [D]         qwen3: RMSNorm of each key head
//    8 self_attn.v_proj.weight          [Hkv*D, d]
//    9 self_attn.v_proj.bias            [Hkv*D]     qkv bias
//   10 self_attn.o_proj.weight          [d, Hq*D]
//   11 self_attn.o_proj.bias            [d]         llama/qwen3 attention_bias only
//   12 post_attention_layernorm.weight  [d]
//   13 mlp.gate_proj.weight             [F, d]
//   14 mlp.gate_proj.bias               [F]         llama mlp_bias
//   15 mlp.up_proj.weight               [F, d]
//   16 mlp.up_proj.bias                 [F]         mlp_bias
//   17 mlp.down_proj.weight             [d, F]
//   18 mlp.down_proj.bias               [d]         mlp_bias
// Names are the full HF names, "model.layers.<i>.<name above>". Weight matrices
// are row-major [out, in] as in HF (y = x W^T + b).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "engine/model/tensor_role.h"

namespace megatrain::engine {

inline constexpr size_t kTensorAlignmentFloats = 16;

enum class EntryKind { kEmbedding, kLayer, kFinalNorm, kLmHead };


std::string_view TensorRoleName(TensorRole role);
std::string_view EntryKindName(EntryKind kind);

struct TensorSlot {
  std::string hf_name;
  size_t offset = 0;  // in floats from the start of the entry; multiple of 16
  std::vector<int64_t> shape;
  bool weight_decay = false;  // true only for 2-D weight matrices
  TensorRole role = TensorRole::kEmbedding;

  size_t num_elements() const;
};

struct LayoutEntry {
  EntryKind kind = EntryKind::kLayer;
  int layer = -1;           // 0..L-1 for kLayer, -1 otherwise
  size_t num_elements = 0;  // padded length of the buffer in floats; multiple of 16
  std::vector<TensorSlot> tensors;
};

struct TensorLocation {
  int entry = -1;
  const TensorSlot* slot = nullptr;  // points into the layout; valid while it lives
};

class ParameterLayout {
 public:
  static absl::StatusOr<ParameterLayout> Create(const ModelConfig& config);

  // Move-only: TensorLocation and the name index point into entries_.
  ParameterLayout(ParameterLayout&&) = default;
  ParameterLayout& operator=(ParameterLayout&&) = default;
  ParameterLayout(const ParameterLayout&) = delete;
  ParameterLayout& operator=(const ParameterLayout&) = delete;

  const std::vector<LayoutEntry>& entries() const { return entries_; }
  int num_entries() const { return static_cast<int>(entries_.size()); }
  // Entry index of the embedding (0), layer i (1 + i), final norm, LM head
  // (-1 when tied: the embedding entry serves as the head).
  int embedding_entry() const { return 0; }
  int layer_entry(int layer) const { return 1 + layer; }
  int final_norm_entry() const { return 1 + num_layers_; }
  int lm_head_entry() const { return tied_ ? -1 : 2 + num_layers_; }
  bool tied_embeddings() const { return tied_; }

  // NotFound naming hf_name when the layout has no such tensor.
  absl::StatusOr<TensorLocation> Find(std::string_view hf_name) const;
  // nullptr when the entry has no tensor of that role (e.g. an absent bias).
  const TensorSlot* Find(int entry, TensorRole role) const;

  // Sum of tensor sizes: the model's parameter count (no padding).
  int64_t parameter_count() const { return parameter_count_; }
  // Sum of entry lengths in floats (parameters + alignment padding).
  int64_t padded_element_count() const { return padded_element_count_; }

  // One line per tensor: "name  entry=E offset=O shape=[a, b]", plus totals.
  std::string DescribeTable() const;

 private:
  ParameterLayout() = default;

  std::vector<LayoutEntry> entries_;
  // Per entry, the slot index of each role, or -1.
  std::vector<std::array<int, kNumTensorRoles>> role_index_;
  absl::flat_hash_map<std::string, std::pair<int, int>> name_index_;  // -> (entry, slot)
  int num_layers_ = 0;
  bool tied_ = false;
  int64_t parameter_count_ = 0;
  int64_t padded_element_count_ = 0;
};

}  // namespace megatrain::engine
