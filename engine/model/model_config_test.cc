// Tests for ModelConfig parsing, validation, refusals and HF export.
#include "engine/model/model_config.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::engine {
namespace {

using ::testing::HasSubstr;

// Written from the published config.json files of these checkpoints.
constexpr char kLlama31_8B[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

constexpr char kLlama2_7B[] = R"({
  "_name_or_path": "meta-llama/Llama-2-7b-hf",
  "architectures": ["LlamaForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 11008,
  "max_position_embeddings": 4096,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 32,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "tie_word_embeddings": false,
  "torch_dtype": "float16",
  "transformers_version": "4.31.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";

constexpr char kLlama32_1B[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

constexpr char kQwen25_05B[] = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// Qwen3-0.6B's published config.json: head_dim 128 with hidden 1024 / 16 heads.
constexpr char kQwen3_06B[] = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

constexpr char kMistral7B_v01[] = R"({
  "architectures": ["MistralForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "sliding_window": 4096,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.34.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";

constexpr char kMistral7B_v03[] = R"({
  "architectures": ["MistralForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 1000000.0,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.42.0.dev0",
  "use_cache": true,
  "vocab_size": 32768
})";

ModelConfig MustParse(const std::string& text) {
  auto config = ParseModelConfig(text);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : ModelConfig{};
}

TEST(ModelConfigTest, Llama31_8B) {
  const ModelConfig c = MustParse(kLlama31_8B);
  EXPECT_EQ(c.family, ModelFamily::kLlama);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.num_hidden_layers, 32);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.q_dim(), 4096);
  EXPECT_EQ(c.kv_dim(), 1024);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_TRUE(c.rope_scaling.enabled);
  EXPECT_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_FALSE(c.use_sliding_window);
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_EQ(c.passthrough.at("bos_token_id"), "128000");
  EXPECT_EQ(c.passthrough.count("torch_dtype"), 0u);
  EXPECT_TRUE(c.CheckSequenceLength(131072).ok());

  const kernels::RopeScaling k = c.KernelRopeScaling();
  EXPECT_EQ(k.factor, 8.0);
  EXPECT_EQ(k.original_max_position_embeddings, 8192.0);
}

TEST(ModelConfigTest, Llama2_7B) {
  const ModelConfig c = MustParse(kLlama2_7B);
  EXPECT_EQ(c.num_key_value_heads, 32);
  EXPECT_EQ(c.intermediate_size, 11008);
  EXPECT_EQ(c.rope_theta, 10000.0);  // HF default: the key is absent
  EXPECT_FALSE(c.rope_scaling.enabled);
  EXPECT_EQ(c.KernelRopeScaling().factor, 0.0);  // "no scaling" for the kernels
  EXPECT_EQ(c.passthrough.at("_name_or_path"), "\"meta-llama/Llama-2-7b-hf\"");
}

TEST(ModelConfigTest, Llama32_1B_TiedWithExplicitHeadDim) {
  const ModelConfig c = MustParse(kLlama32_1B);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.rope_scaling.factor, 32.0);
}

TEST(ModelConfigTest, Qwen25_05B_TiedWithQkvBias) {
  const ModelConfig c = MustParse(kQwen25_05B);
  EXPECT_EQ(c.family, ModelFamily::kQwen2);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.sliding_window, 32768);
  EXPECT_FALSE(c.use_sliding_window);
  // Sliding window disabled: any length is full causal attention.
  EXPECT_TRUE(c.CheckSequenceLength(100000).ok());
}

TEST(ModelConfigTest, Qwen3_06B_ExplicitHeadDimAndQkNorm) {
  const ModelConfig c = MustParse(kQwen3_06B);
  EXPECT_EQ(c.family, ModelFamily::kQwen3);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.q_dim(), 2048);  // not hidden_size: q_proj is [2048, 1024]
  EXPECT_EQ(c.kv_dim(), 1024);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_FALSE(c.use_sliding_window);
  EXPECT_TRUE(c.CheckSequenceLength(40960).ok());
  // Not the other families: only qwen3 normalises q and k.
  EXPECT_FALSE(MustParse(kQwen25_05B).qk_norm);
}

TEST(ModelConfigTest, Qwen3DefaultsAndAttentionBias) {
  auto j = nlohmann::json::parse(kQwen3_06B);
  j.erase("head_dim");  // Qwen3Config's default is 128, not hidden / heads (64 here)
  j["hidden_size"] = 1024;
  j["num_attention_heads"] = 16;
  EXPECT_EQ(MustParse(j.dump()).head_dim, 128);
  j["attention_bias"] = true;  // q/k/v and o biases, as in Qwen3Attention
  const ModelConfig biased = MustParse(j.dump());
  EXPECT_TRUE(biased.qkv_bias);
  EXPECT_TRUE(biased.o_bias);
  EXPECT_FALSE(biased.mlp_bias);
  j = nlohmann::json::parse(kQwen3_06B);
  j["use_sliding_window"] = true;
  j["sliding_window"] = 4096;
  const ModelConfig windowed = MustParse(j.dump());
  EXPECT_TRUE(windowed.use_sliding_window);
  EXPECT_EQ(windowed.CheckSequenceLength(4097).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelConfigTest, Qwen3RefusesWhatItDoesNotImplement) {
  auto j = nlohmann::json::parse(kQwen3_06B);
  j["mlp_bias"] = false;  // a Llama key, not Qwen3's
  auto c = ParseModelConfig(j.dump());
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("unsupported key 'mlp_bias'"));
  j = nlohmann::json::parse(kQwen3_06B);
  j["architectures"] = {"Qwen2ForCausalLM"};
  c = ParseModelConfig(j.dump());
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("expected [\"Qwen3ForCausalLM\"]"));
  j = nlohmann::json::parse(kQwen3_06B);
  j["head_dim"] = 127;
  c = ParseModelConfig(j.dump());
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("'head_dim' = 127"));
}

TEST(ModelConfigTest, Qwen2WithSlidingWindowOnlyWithinWindow) {
  auto j = nlohmann::json::parse(kQwen25_05B);
  j["use_sliding_window"] = true;
  const ModelConfig c = MustParse(j.dump());
  EXPECT_TRUE(c.use_sliding_window);
  EXPECT_TRUE(c.CheckSequenceLength(32768).ok());
  const absl::Status s = c.CheckSequenceLength(32769);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("seq_len = 32769"));
  EXPECT_THAT(s.message(), HasSubstr("sliding_window = 32768"));
}

TEST(ModelConfigTest, Qwen2LayerTypes) {
  auto j = nlohmann::json::parse(kQwen25_05B);
  j["layer_types"] = std::vector<std::string>(24, "full_attention");
  ModelConfig c = MustParse(j.dump());
  EXPECT_FALSE(c.use_sliding_window);
  j["layer_types"][23] = "sliding_attention";
  c = MustParse(j.dump());
  EXPECT_TRUE(c.use_sliding_window);  // conservative: declared sliding layers count
  EXPECT_FALSE(c.CheckSequenceLength(40000).ok());
  j["layer_types"][3] = "chunked_attention";
  auto bad = ParseModelConfig(j.dump());
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("'layer_types[3]' = \"chunked_attention\""));
  j["layer_types"] = std::vector<std::string>(5, "full_attention");
  bad = ParseModelConfig(j.dump());
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("'layer_types'"));
}

TEST(ModelConfigTest, MistralSlidingWindowLimitsSequenceLength) {
  const ModelConfig c = MustParse(kMistral7B_v01);
  EXPECT_EQ(c.family, ModelFamily::kMistral);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_TRUE(c.use_sliding_window);
  EXPECT_TRUE(c.CheckSequenceLength(4096).ok());
  const absl::Status s = c.CheckSequenceLength(4097);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("seq_len = 4097"));
  EXPECT_THAT(s.message(), HasSubstr("sliding_window = 4096"));
  EXPECT_THAT(s.message(), HasSubstr("mistral"));
  EXPECT_FALSE(c.CheckSequenceLength(0).ok());
}

TEST(ModelConfigTest, MistralNullWindowAndHfDefaultWindow) {
  const ModelConfig v3 = MustParse(kMistral7B_v03);
  EXPECT_FALSE(v3.sliding_window.has_value());
  EXPECT_FALSE(v3.use_sliding_window);
  EXPECT_TRUE(v3.CheckSequenceLength(32768).ok());
  EXPECT_EQ(v3.vocab_size, 32768);

  auto j = nlohmann::json::parse(kMistral7B_v03);
  j.erase("sliding_window");  // HF's MistralConfig default is 4096
  const ModelConfig absent = MustParse(j.dump());
  EXPECT_EQ(absent.sliding_window, 4096);
  EXPECT_FALSE(absent.CheckSequenceLength(4097).ok());
}

TEST(ModelConfigTest, DefaultsForAbsentOptionalKeys) {
  const ModelConfig c = MustParse(R"({"model_type": "llama", "vocab_size": 11, "hidden_size": 12,
      "intermediate_size": 10, "num_hidden_layers": 2, "num_attention_heads": 3,
      "max_position_embeddings": 64})");
  EXPECT_EQ(c.num_key_value_heads, 3);
  EXPECT_EQ(c.head_dim, 4);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.rope_scaling.enabled);
}

TEST(ModelConfigTest, LlamaBiases) {
  auto j = nlohmann::json::parse(kLlama2_7B);
  j["attention_bias"] = true;
  j["mlp_bias"] = true;
  const ModelConfig c = MustParse(j.dump());
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_TRUE(c.o_bias);
  EXPECT_TRUE(c.mlp_bias);
}

TEST(ModelConfigTest, RopeParametersOfTransformersV5) {
  auto j = nlohmann::json::parse(kLlama31_8B);
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 500000.0},
                          {"factor", 8.0},           {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  EXPECT_EQ(MustParse(j.dump()), MustParse(kLlama31_8B));
}

TEST(ModelConfigTest, ToJsonRoundTrips) {
  for (const char* text :
       {kLlama31_8B, kLlama2_7B, kLlama32_1B, kQwen25_05B, kQwen3_06B, kMistral7B_v01,
        kMistral7B_v03}) {
    const ModelConfig c = MustParse(text);
    const std::string exported = c.ToJson();
    auto again = ParseModelConfig(exported);
    ASSERT_TRUE(again.ok()) << again.status() << "\n" << exported;
    EXPECT_EQ(*again, c) << exported;
    const auto j = nlohmann::json::parse(exported);
    EXPECT_EQ(j["torch_dtype"], "float32");
    EXPECT_EQ(j["model_type"], std::string(ModelTypeName(c.family)));
  }
}

struct RefusalCase {
  const char* name;
  std::function<void(nlohmann::json&)> mutate;
  std::string expected;
};

TEST(ModelConfigTest, RefusalsNameTheFieldAndValue) {
  using J = nlohmann::json;
  const std::vector<RefusalCase> cases = {
      {"model_type", [](J& j) { j["model_type"] = "gpt2"; }, "'model_type' = \"gpt2\""},
      {"no model_type", [](J& j) { j.erase("model_type"); }, "'model_type' is missing"},
      {"hidden_act", [](J& j) { j["hidden_act"] = "gelu"; }, "'hidden_act' = \"gelu\""},
      {"yarn",
       [](J& j) {
         j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
       },
       "'rope_scaling.rope_type' = \"yarn\""},
      {"linear",
       [](J& j) {
         j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
       },
       "'rope_scaling.type' = \"linear\""},
      {"dynamic",
       [](J& j) {
         j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
       },
       "'rope_scaling.type' = \"dynamic\""},
      {"longrope",
       [](J& j) {
         j["rope_scaling"] = {{"rope_type", "longrope"}};
       },
       "'rope_scaling.rope_type' = \"longrope\""},
      {"rope no type",
       [](J& j) {
         j["rope_scaling"] = {{"factor", 2.0}};
       },
       "'rope_scaling' has no rope_type"},
      {"rope extra key", [](J& j) { j["rope_scaling"]["beta_fast"] = 32; },
       "unsupported key 'rope_scaling.beta_fast' = 32"},
      {"rope missing factor", [](J& j) { j["rope_scaling"].erase("factor"); },
       "'rope_scaling.factor' is required"},
      {"rope factor < 1", [](J& j) { j["rope_scaling"]["factor"] = 0.5; },
       "'rope_scaling.factor' = 0.5"},
      {"rope high <= low", [](J& j) { j["rope_scaling"]["high_freq_factor"] = 1.0; },
       "'rope_scaling.high_freq_factor' = 1.0"},
      {"rope_theta", [](J& j) { j["rope_theta"] = -5.0; }, "'rope_theta' = -5.0"},
      {"pretraining_tp", [](J& j) { j["pretraining_tp"] = 2; }, "'pretraining_tp' = 2"},
      {"attention_dropout", [](J& j) { j["attention_dropout"] = 0.1; },
       "'attention_dropout' = 0.1"},
      {"unknown key", [](J& j) { j["foo"] = 1; },
       "config.json: unsupported key 'foo' = 1; megatrain does not implement it"},
      {"quantization_config",
       [](J& j) {
         j["quantization_config"] = {{"quant_method", "bitsandbytes"}};
       },
       "unsupported key 'quantization_config' = {\"quant_method\":\"bitsandbytes\"}"},
      {"sliding_window on llama", [](J& j) { j["sliding_window"] = 4096; },
       "unsupported key 'sliding_window' = 4096"},
      {"missing vocab_size", [](J& j) { j.erase("vocab_size"); }, "'vocab_size' is required"},
      {"missing max_position_embeddings", [](J& j) { j.erase("max_position_embeddings"); },
       "'max_position_embeddings' is required"},
      {"zero hidden_size", [](J& j) { j["hidden_size"] = 0; }, "'hidden_size' = 0"},
      {"negative layers", [](J& j) { j["num_hidden_layers"] = -1; }, "'num_hidden_layers' = -1"},
      {"string vocab", [](J& j) { j["vocab_size"] = "32000"; },
       "'vocab_size' = \"32000\": must be an integer"},
      {"float hidden", [](J& j) { j["hidden_size"] = 4096.0; },
       "'hidden_size' = 4096.0: must be an integer"},
      {"huge vocab", [](J& j) { j["vocab_size"] = 1ull << 40; }, "'vocab_size' = 1099511627776"},
      {"kv heads divide", [](J& j) { j["num_key_value_heads"] = 5; },
       "'num_key_value_heads' = 5: must divide num_attention_heads (32)"},
      {"hidden not multiple of heads", [](J& j) { j["hidden_size"] = 4100; },
       "'hidden_size' = 4100: must be a multiple of num_attention_heads (32)"},
      {"odd derived head_dim", [](J& j) { j["hidden_size"] = 32 * 127; },
       "gives an odd head_dim 127"},
      {"odd head_dim", [](J& j) { j["head_dim"] = 63; }, "'head_dim' = 63: must be even"},
      {"rms_norm_eps", [](J& j) { j["rms_norm_eps"] = -1e-5; }, "'rms_norm_eps' = -1e-05"},
      {"tie not bool", [](J& j) { j["tie_word_embeddings"] = "yes"; },
       "'tie_word_embeddings' = \"yes\""},
      {"attention_bias not bool", [](J& j) { j["attention_bias"] = 1; }, "'attention_bias' = 1"},
      {"architectures", [](J& j) { j["architectures"] = {"LlamaForSequenceClassification"}; },
       "'architectures' = [\"LlamaForSequenceClassification\"]"},
      {"rope_parameters with rope_scaling",
       [](J& j) {
         j["rope_parameters"] = {{"rope_type", "default"}};
       },
       "'rope_parameters'"},
  };
  const auto base = nlohmann::json::parse(kLlama31_8B);
  for (const RefusalCase& c : cases) {
    auto j = base;
    c.mutate(j);
    auto parsed = ParseModelConfig(j.dump());
    ASSERT_FALSE(parsed.ok()) << c.name;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.expected)) << c.name;
    EXPECT_THAT(parsed.status().message(), HasSubstr("config.json")) << c.name;
  }
}

TEST(ModelConfigTest, FamilySpecificKeysAreRefusedElsewhere) {
  auto q = nlohmann::json::parse(kQwen25_05B);
  q["attention_bias"] = false;
  auto parsed = ParseModelConfig(q.dump());
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("unsupported key 'attention_bias' = false"));

  auto m = nlohmann::json::parse(kMistral7B_v01);
  m["use_sliding_window"] = false;
  parsed = ParseModelConfig(m.dump());
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("unsupported key 'use_sliding_window'"));

  q = nlohmann::json::parse(kQwen25_05B);
  q["use_sliding_window"] = true;
  q["sliding_window"] = nullptr;
  parsed = ParseModelConfig(q.dump());
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("'sliding_window'"));
}

TEST(ModelConfigTest, MalformedJson) {
  auto parsed = ParseModelConfig("{\"model_type\": ");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("config.json: invalid JSON"));
  parsed = ParseModelConfig("[1]");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("top level must be a JSON object"));
  parsed = ParseModelConfig(R"({"model_type": "llama", "model_type": "gpt2"})");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("duplicate key 'model_type'"));
}

TEST(ModelConfigTest, LoadFromFile) {
  const std::string path = ::testing::TempDir() + "/config.json";
  {
    std::ofstream out(path);
    out << kMistral7B_v01;
  }
  auto c = LoadModelConfig(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kMistral);
  {
    std::ofstream out(path);
    out << R"({"model_type": "bert"})";
  }
  c = LoadModelConfig(path);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr(path + ": config.json: 'model_type' = \"bert\""));
  c = LoadModelConfig(path + ".missing");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace megatrain::engine
