// Preset architectures (sizes from the models' published config.json files).
#include "engine/planner/model_presets.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace megatrain::engine::planner {
namespace {

struct Preset {
  const char* name;
  const char* type;
  int64_t vocab, hidden, ffn;
  int layers, heads, kv_heads;
  bool tied;
  int head_dim = 0;  // 0: hidden / heads (not written); Qwen3 states 128 whatever the width
};

// qwen2.5-120b-shape is not a released model: it is a Qwen2-shaped stand-in of about 120B
// parameters for the "120B on one H200" setting.
constexpr Preset kPresets[] = {
    {"qwen2.5-0.5b", "qwen2", 151936, 896, 4864, 24, 14, 2, true},
    {"qwen2.5-1.5b", "qwen2", 151936, 1536, 8960, 28, 12, 2, true},
    {"qwen2.5-3b", "qwen2", 151936, 2048, 11008, 36, 16, 2, true},
    {"qwen2.5-7b", "qwen2", 152064, 3584, 18944, 28, 28, 4, false},
    {"qwen2.5-14b", "qwen2", 152064, 5120, 13824, 48, 40, 8, false},
    {"qwen2.5-32b", "qwen2", 152064, 5120, 27648, 64, 40, 8, false},
    {"qwen2.5-72b", "qwen2", 152064, 8192, 29568, 80, 64, 8, false},
    {"qwen2.5-120b-shape", "qwen2", 152064, 10240, 32768, 96, 80, 8, false},
    {"qwen3-0.6b", "qwen3", 151936, 1024, 3072, 28, 16, 8, true, 128},
    {"qwen3-1.7b", "qwen3", 151936, 2048, 6144, 28, 16, 8, true, 128},
    {"qwen3-4b", "qwen3", 151936, 2560, 9728, 36, 32, 8, true, 128},
    {"qwen3-8b", "qwen3", 151936, 4096, 12288, 36, 32, 8, false, 128},
    {"qwen3-14b", "qwen3", 151936, 5120, 17408, 40, 40, 8, false, 128},
    {"qwen3-32b", "qwen3", 151936, 5120, 25600, 64, 64, 8, false, 128},
    {"llama-2-7b", "llama", 32000, 4096, 11008, 32, 32, 32, false},
    {"llama-2-13b", "llama", 32000, 5120, 13824, 40, 40, 40, false},
    {"llama-10b-shape", "llama", 32000, 4096, 11008, 48, 32, 32, false},
};

}  // namespace

std::vector<std::string> ModelPresetNames() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.push_back(p.name);
  return names;
}

absl::StatusOr<ModelConfig> ModelPreset(std::string_view name) {
  for (const Preset& p : kPresets) {
    if (name != p.name) continue;
    return ParseModelConfig(absl::StrCat(
        R"({"model_type": ")", p.type, R"(", "vocab_size": )", p.vocab, R"(, "hidden_size": )",
        p.hidden, R"(, "intermediate_size": )", p.ffn, R"(, "num_hidden_layers": )", p.layers,
        R"(, "num_attention_heads": )", p.heads, R"(, "num_key_value_heads": )", p.kv_heads,
        p.head_dim > 0 ? absl::StrCat(R"(, "head_dim": )", p.head_dim) : std::string(),
        R"(, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
           "hidden_act": "silu", "tie_word_embeddings": )",
        p.tied ? "true" : "false", "}"));
  }
  return absl::NotFoundError(absl::StrCat("no model preset named '", std::string(name),
                                          "'; known: ", absl::StrJoin(ModelPresetNames(), ", ")));
}

}  // namespace megatrain::engine::planner
