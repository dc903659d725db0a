// Small Llama-family configurations and deterministic token batches shared by
// the engine's integration tests.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/device/cpu_device.h"
#include "engine/model/model_config.h"
#include "engine/train/trainer.h"

namespace megatrain::engine::testing {

struct TinyShape {
  int layers = 4;
  int hidden = 48;
  int ffn = 88;
  int heads = 6;
  int kv_heads = 2;
  int vocab = 97;
  bool tied = false;
  const char* model_type = "llama";  // or "qwen3" (per-head q/k norms)
  int head_dim = 0;                  // 0: not written (hidden / heads; qwen3 would take 128)
};

inline ModelConfig TinyConfig(const TinyShape& s) {
  const std::string json = absl::StrCat(
      R"({"model_type": ")", s.model_type, R"(", "vocab_size": )", s.vocab,
      R"(, "hidden_size": )", s.hidden,
      s.head_dim > 0 ? absl::StrCat(R"(, "head_dim": )", s.head_dim) : std::string(),
      R"(, "intermediate_size": )", s.ffn, R"(, "num_hidden_layers": )", s.layers,
      R"(, "num_attention_heads": )", s.heads, R"(, "num_key_value_heads": )", s.kv_heads,
      R"(, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
          "hidden_act": "silu", "tie_word_embeddings": )",
      s.tied ? "true" : "false", "}");
  absl::StatusOr<ModelConfig> config = ParseModelConfig(json);
  if (!config.ok()) {
    fprintf(stderr, "TinyConfig: %s\n", std::string(config.status().message()).c_str());
    abort();
  }
  return *config;
}

// Token ids from a fixed linear congruential sequence; every 7th target is
// ignored so masking is exercised.
struct TokenBatches {
  std::vector<std::vector<int32_t>> inputs, targets;
  std::vector<const int32_t*> InputPointers(int first, int count) const {
    std::vector<const int32_t*> p;
    for (int i = first; i < first + count; ++i) p.push_back(inputs[i].data());
    return p;
  }
  std::vector<const int32_t*> TargetPointers(int first, int count) const {
    std::vector<const int32_t*> p;
    for (int i = first; i < first + count; ++i) p.push_back(targets[i].data());
    return p;
  }
};

inline TokenBatches MakeTokenBatches(int count, int tokens, int vocab, uint64_t seed) {
  TokenBatches b;
  uint64_t state = seed;
  for (int i = 0; i < count; ++i) {
    std::vector<int32_t> in(tokens), tg(tokens);
    for (int t = 0; t < tokens; ++t) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      in[t] = static_cast<int32_t>((state >> 33) % vocab);
      tg[t] = (t % 7 == 3) ? -100 : static_cast<int32_t>((state >> 13) % vocab);
    }
    b.inputs.push_back(std::move(in));
    b.targets.push_back(std::move(tg));
  }
  return b;
}

inline std::unique_ptr<CpuDevice> MakeCpuDevice(size_t arena_bytes, double link_gbps = 0,
                                                double latency_us = 0) {
  DeviceOptions o;
  o.arena_bytes = arena_bytes;
  o.pinned_budget_bytes = size_t{4} << 30;
  o.link_gbps = link_gbps;
  o.link_latency_us = latency_us;
  absl::StatusOr<std::unique_ptr<CpuDevice>> d = CpuDevice::Create(o);
  if (!d.ok()) abort();
  return std::move(*d);
}

}  // namespace megatrain::engine::testing
