// Tests for ParameterLayout: order, offsets, alignment, lookups and totals.
#include "engine/model/parameter_layout.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::engine {
namespace {

using ::testing::HasSubstr;

ModelConfig Llama31_8B() {
  ModelConfig c;
  c.family = ModelFamily::kLlama;
  c.vocab_size = 128256;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_hidden_layers = 32;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.head_dim = 128;
  c.max_position_embeddings = 131072;
  return c;
}

ModelConfig Qwen25_05B() {
  ModelConfig c;
  c.family = ModelFamily::kQwen2;
  c.vocab_size = 151936;
  c.hidden_size = 896;
  c.intermediate_size = 4864;
  c.num_hidden_layers = 24;
  c.num_attention_heads = 14;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.max_position_embeddings = 32768;
  c.tie_word_embeddings = true;
  c.qkv_bias = true;
  return c;
}

ModelConfig Qwen3_06B() {
  ModelConfig c;
  c.family = ModelFamily::kQwen3;
  c.vocab_size = 151936;
  c.hidden_size = 1024;
  c.intermediate_size = 3072;
  c.num_hidden_layers = 28;
  c.num_attention_heads = 16;
  c.num_key_value_heads = 8;
  c.head_dim = 128;
  c.max_position_embeddings = 40960;
  c.tie_word_embeddings = true;
  c.qk_norm = true;
  return c;
}

// Odd sizes everywhere, every optional bias on.
ModelConfig TinyWithAllBiases() {
  ModelConfig c;
  c.family = ModelFamily::kLlama;
  c.vocab_size = 11;
  c.hidden_size = 7;
  c.intermediate_size = 9;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 3;
  c.num_key_value_heads = 1;
  c.head_dim = 6;
  c.max_position_embeddings = 64;
  c.qkv_bias = c.o_bias = c.mlp_bias = true;
  return c;
}

TEST(ParameterLayoutTest, Llama31_8BParameterCount) {
  auto layout = ParameterLayout::Create(Llama31_8B());
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->parameter_count(), int64_t{8030261248});
  // Every Llama-3.1-8B tensor size is a multiple of 16 floats: no padding.
  EXPECT_EQ(layout->padded_element_count(), int64_t{8030261248});
  EXPECT_EQ(layout->num_entries(), 35);
  EXPECT_EQ(layout->lm_head_entry(), 34);
  EXPECT_EQ(layout->entries()[34].kind, EntryKind::kLmHead);

  const LayoutEntry& layer0 = layout->entries()[1];
  EXPECT_EQ(layer0.kind, EntryKind::kLayer);
  EXPECT_EQ(layer0.layer, 0);
  ASSERT_EQ(layer0.tensors.size(), 9u);
  EXPECT_EQ(layer0.tensors[0].hf_name, "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(layer0.tensors[1].offset, 4096u);                                  // q
  EXPECT_EQ(layer0.tensors[2].offset, 4096u + 4096u * 4096u);                  // k
  EXPECT_EQ(layer0.tensors[3].offset, 4096u + 4096u * 4096u + 1024u * 4096u);  // v
  EXPECT_EQ(layer0.num_elements, 218112000u);
}

TEST(ParameterLayoutTest, Qwen25_05BTiedWithQkvBias) {
  auto layout = ParameterLayout::Create(Qwen25_05B());
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->parameter_count(), int64_t{494032768});
  EXPECT_EQ(layout->num_entries(), 1 + 24 + 1);
  EXPECT_TRUE(layout->tied_embeddings());
  EXPECT_EQ(layout->lm_head_entry(), -1);
  EXPECT_FALSE(layout->Find("lm_head.weight").ok());
  const int e = layout->layer_entry(5);
  ASSERT_NE(layout->Find(e, TensorRole::kQBias), nullptr);
  EXPECT_EQ(layout->Find(e, TensorRole::kKBias)->shape, std::vector<int64_t>{128});
  EXPECT_EQ(layout->Find(e, TensorRole::kOBias), nullptr);
  EXPECT_EQ(layout->Find(e, TensorRole::kGateBias), nullptr);
}

TEST(ParameterLayoutTest, Qwen3_06BWithPerHeadNorms) {
  auto layout = ParameterLayout::Create(Qwen3_06B());
  ASSERT_TRUE(layout.ok()) << layout.status();
  // 151936*1024 embedding + 28 * (q 2048*1024 + k, v 1024*1024 + o 1024*2048 +
  // 3 * 1024*3072 + 2 * 1024 norms + 2 * 128 q/k norms) + 1024 final norm.
  EXPECT_EQ(layout->parameter_count(), int64_t{596049920});
  const LayoutEntry& layer0 = layout->entries()[1];
  ASSERT_EQ(layer0.tensors.size(), 11u);
  EXPECT_EQ(layer0.tensors[1].hf_name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(layer0.tensors[1].shape, (std::vector<int64_t>{2048, 1024}));
  EXPECT_EQ(layer0.tensors[2].hf_name, "model.layers.0.self_attn.q_norm.weight");
  EXPECT_EQ(layer0.tensors[4].hf_name, "model.layers.0.self_attn.k_norm.weight");
  EXPECT_EQ(layer0.tensors[6].shape, (std::vector<int64_t>{1024, 2048}));  // o_proj
  for (const char* name :
       {"model.layers.27.self_attn.q_norm.weight", "model.layers.27.self_attn.k_norm.weight"}) {
    auto loc = layout->Find(name);
    ASSERT_TRUE(loc.ok()) << loc.status();
    EXPECT_EQ(loc->slot->shape, std::vector<int64_t>{128});
    EXPECT_FALSE(loc->slot->weight_decay) << name;  // norms never decay
    EXPECT_EQ(loc->slot->offset % kTensorAlignmentFloats, 0u);
  }
  EXPECT_EQ(layout->Find(layout->layer_entry(3), TensorRole::kQNorm)->hf_name,
            "model.layers.3.self_attn.q_norm.weight");
  EXPECT_EQ(layout->Find(layout->layer_entry(3), TensorRole::kKNorm)->hf_name,
            "model.layers.3.self_attn.k_norm.weight");
  // Without qk_norm (every other family) the roles are absent.
  auto qwen2 = ParameterLayout::Create(Qwen25_05B());
  ASSERT_TRUE(qwen2.ok());
  EXPECT_EQ(qwen2->Find(qwen2->layer_entry(0), TensorRole::kQNorm), nullptr);
  EXPECT_EQ(qwen2->Find(qwen2->layer_entry(0), TensorRole::kKNorm), nullptr);
}

TEST(ParameterLayoutTest, DocumentedOrderOffsetsAndAlignment) {
  auto layout = ParameterLayout::Create(TinyWithAllBiases());
  ASSERT_TRUE(layout.ok()) << layout.status();
  const std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"input_layernorm.weight", {7}},  {"self_attn.q_proj.weight", {18, 7}},
      {"self_attn.q_proj.bias", {18}},  {"self_attn.k_proj.weight", {6, 7}},
      {"self_attn.k_proj.bias", {6}},   {"self_attn.v_proj.weight", {6, 7}},
      {"self_attn.v_proj.bias", {6}},   {"self_attn.o_proj.weight", {7, 18}},
      {"self_attn.o_proj.bias", {7}},   {"post_attention_layernorm.weight", {7}},
      {"mlp.gate_proj.weight", {9, 7}}, {"mlp.gate_proj.bias", {9}},
      {"mlp.up_proj.weight", {9, 7}},   {"mlp.up_proj.bias", {9}},
      {"mlp.down_proj.weight", {7, 9}}, {"mlp.down_proj.bias", {7}},
  };
  const TensorRole roles[] = {TensorRole::kInputNorm, TensorRole::kQ,
                              TensorRole::kQBias,     TensorRole::kK,
                              TensorRole::kKBias,     TensorRole::kV,
                              TensorRole::kVBias,     TensorRole::kO,
                              TensorRole::kOBias,     TensorRole::kPostAttentionNorm,
                              TensorRole::kGate,      TensorRole::kGateBias,
                              TensorRole::kUp,        TensorRole::kUpBias,
                              TensorRole::kDown,      TensorRole::kDownBias};
  int64_t params = 0;
  for (int i = 0; i < 3; ++i) {
    const int e = layout->layer_entry(i);
    const LayoutEntry& entry = layout->entries()[e];
    EXPECT_EQ(entry.layer, i);
    ASSERT_EQ(entry.tensors.size(), expected.size());
    size_t end = 0;
    for (size_t s = 0; s < expected.size(); ++s) {
      const TensorSlot& slot = entry.tensors[s];
      EXPECT_EQ(slot.hf_name, "model.layers." + std::to_string(i) + "." + expected[s].first);
      EXPECT_EQ(slot.shape, expected[s].second);
      EXPECT_EQ(slot.role, roles[s]);
      EXPECT_EQ(slot.weight_decay, slot.shape.size() == 2) << slot.hf_name;
      EXPECT_EQ(slot.offset % kTensorAlignmentFloats, 0u);
      EXPECT_GE(slot.offset, end);                           // no overlap, in order
      EXPECT_LT(slot.offset, end + kTensorAlignmentFloats);  // minimal padding
      end = slot.offset + slot.num_elements();
      params += static_cast<int64_t>(slot.num_elements());
      EXPECT_EQ(layout->Find(e, roles[s]), &slot);
      auto found = layout->Find(slot.hf_name);
      ASSERT_TRUE(found.ok());
      EXPECT_EQ(found->entry, e);
      EXPECT_EQ(found->slot, &slot);
    }
    EXPECT_EQ(entry.num_elements % kTensorAlignmentFloats, 0u);
    EXPECT_GE(entry.num_elements, end);
    EXPECT_LT(entry.num_elements, end + kTensorAlignmentFloats);
  }
  // q: 18*7=126 -> padded to 128, so the bias starts at 16 (norm) + 128.
  EXPECT_EQ(layout->entries()[1].tensors[2].offset, 16u + 128u);

  const int64_t embed = 11 * 7, norm = 7, head = 11 * 7;
  EXPECT_EQ(layout->parameter_count(), params + embed + norm + head);
  EXPECT_EQ(layout->num_entries(), 6);
  EXPECT_EQ(layout->entries()[0].kind, EntryKind::kEmbedding);
  EXPECT_EQ(layout->entries()[0].tensors[0].hf_name, "model.embed_tokens.weight");
  EXPECT_TRUE(layout->entries()[0].tensors[0].weight_decay);
  EXPECT_EQ(layout->entries()[0].num_elements, 80u);
  EXPECT_EQ(layout->entries()[4].kind, EntryKind::kFinalNorm);
  EXPECT_EQ(layout->entries()[4].tensors[0].hf_name, "model.norm.weight");
  EXPECT_FALSE(layout->entries()[4].tensors[0].weight_decay);
  EXPECT_EQ(layout->entries()[5].kind, EntryKind::kLmHead);
  EXPECT_EQ(layout->entries()[5].tensors[0].hf_name, "lm_head.weight");
  EXPECT_TRUE(layout->entries()[5].tensors[0].weight_decay);
  EXPECT_EQ(layout->Find(5, TensorRole::kLmHead), &layout->entries()[5].tensors[0]);
  EXPECT_EQ(layout->Find(5, TensorRole::kEmbedding), nullptr);
  EXPECT_EQ(layout->Find(99, TensorRole::kQ), nullptr);

  int64_t padded = 0;
  for (const LayoutEntry& entry : layout->entries()) padded += entry.num_elements;
  EXPECT_EQ(layout->padded_element_count(), padded);
  EXPECT_GT(padded, layout->parameter_count());
}

TEST(ParameterLayoutTest, FindUnknownNameIsNotFound) {
  auto layout = ParameterLayout::Create(TinyWithAllBiases());
  ASSERT_TRUE(layout.ok());
  auto missing = layout->Find("model.layers.3.self_attn.q_proj.weight");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("model.layers.3.self_attn.q_proj.weight"));
}

TEST(ParameterLayoutTest, DescribeTable) {
  auto layout = ParameterLayout::Create(TinyWithAllBiases());
  ASSERT_TRUE(layout.ok());
  const std::string table = layout->DescribeTable();
  EXPECT_THAT(table, HasSubstr("model.layers.0.self_attn.q_proj.bias  entry=1 offset=144 "
                               "shape=[18]\n"));
  EXPECT_THAT(table, HasSubstr("lm_head.weight  entry=5 offset=0 shape=[11, 7] decay\n"));
  EXPECT_THAT(table, HasSubstr("parameters=" + std::to_string(layout->parameter_count())));
}

TEST(ParameterLayoutTest, RefusesUnparsedConfig) {
  EXPECT_FALSE(ParameterLayout::Create(ModelConfig{}).ok());
}

}  // namespace
}  // namespace megatrain::engine
