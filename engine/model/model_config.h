// ModelConfig: the decoder architecture read from a Hugging Face config.json, validated once.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/common/rope.h"

namespace megatrain::engine {

enum class ModelFamily { kLlama, kQwen2, kMistral, kQwen3 };

// "llama", "qwen2", "mistral", "qwen3" (the HF model_type).
std::string_view ModelTypeName(ModelFamily family);

// HF `rope_scaling: {"rope_type": "llama3", ...}`. `enabled == false` means
// plain RoPE (rope_scaling null, absent, or rope_type "default").
struct Llama3RopeScaling {
  bool enabled = false;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;

  bool operator==(const Llama3RopeScaling&) const = default;
};

// A validated decoder config. Every field is the HF meaning; defaults for
// absent optional keys are those of transformers' LlamaConfig / Qwen2Config /
// MistralConfig / Qwen3Config:
//   rms_norm_eps 1e-6 for all four families (HF's class default; real
//     checkpoints usually state it: Llama 2/3 and Mistral ship 1e-5);
//   num_key_value_heads = num_attention_heads; head_dim = hidden/heads
//     (qwen3: 128, Qwen3Config's default; Qwen3 checkpoints state it);
//   rope_theta 10000; hidden_act "silu"; tie_word_embeddings false;
//   mistral sliding_window 4096 when the key is absent (HF default), null = off;
//   qwen2 and qwen3 sliding_window 4096, use_sliding_window false;
//   qwen3 attention_bias false.
struct ModelConfig {
  ModelFamily family = ModelFamily::kLlama;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;        // d
  int64_t intermediate_size = 0;  // F
  int num_hidden_layers = 0;      // L
  int num_attention_heads = 0;    // Hq
  int num_key_value_heads = 0;    // Hkv; divides Hq
  int head_dim = 0;               // D; even
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  Llama3RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  // Biases: q/k/v (llama and qwen3 attention_bias, always on for qwen2), o
  // (llama and qwen3 attention_bias only), gate/up/down (llama mlp_bias).
  bool qkv_bias = false;
  bool o_bias = false;
  bool mlp_bias = false;
  // Qwen3: an RMSNorm over head_dim (weights q_norm / k_norm, [head_dim],
  // eps rms_norm_eps) on every head of q and of k after the projection and
  // before RoPE.
  bool qk_norm = false;
  // Sliding-window attention as configured. The engine implements full causal
  // attention only, which equals sliding-window attention while the sequence
  // fits in the window; CheckSequenceLength enforces that.
  std::optional<int64_t> sliding_window;
  bool use_sliding_window = false;  // effective: mistral with a window, qwen2/qwen3 if enabled
  // Keys that do not change the computation (token ids, dtype, generation
  // settings), kept as JSON text so ToJson can write them back.
  std::map<std::string, std::string> passthrough;

  // Errors (InvalidArgument) when seq_len is not positive or when sliding-window
  // attention would differ from the full causal attention we compute.
  absl::Status CheckSequenceLength(int64_t seq_len) const;

  // An HF-compatible config.json (2-space indent) for this architecture,
  // with torch_dtype "float32". ParseModelConfig(ToJson()) == *this.
  std::string ToJson() const;

  // RoPE warp parameters for kernels/common/rope.h.
  kernels::RopeScaling KernelRopeScaling() const;

  int64_t q_dim() const { return int64_t{num_attention_heads} * head_dim; }
  int64_t kv_dim() const { return int64_t{num_key_value_heads} * head_dim; }

  bool operator==(const ModelConfig&) const = default;
};

// Parses and validates config.json text. Unknown keys, unsupported values and
// inconsistent sizes are InvalidArgument errors naming the key and value.
absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text);

// Reads `path` (a config.json) and parses it; errors are prefixed with the path.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path);

}  // namespace megatrain::engine
