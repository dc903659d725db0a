// Tests for LoadHfWeights: single-file and sharded loads, and every refusal.
#include "engine/model/hf_loader.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/model/parameter_layout.h"
#include "engine/model/safetensors_dtype.h"
#include "engine/model/safetensors_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::engine {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

ModelConfig TinyLlama(bool tied) {
  ModelConfig c;
  c.family = ModelFamily::kLlama;
  c.vocab_size = 13;
  c.hidden_size = 10;
  c.intermediate_size = 7;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 5;
  c.num_key_value_heads = 1;
  c.head_dim = 2;
  c.max_position_embeddings = 32;
  c.qkv_bias = c.o_bias = c.mlp_bias = true;
  c.tie_word_embeddings = tied;
  return c;
}

// One tensor's source data as stored in the file, and the fp32 it must load as.
struct SourceTensor {
  std::string name;
  std::vector<int64_t> shape;
  SafetensorsDtype dtype;
  std::vector<uint8_t> bytes;
  std::vector<float> expected;
};

// Values for every layout tensor, alternating F32, BF16 and F16 storage.
std::vector<SourceTensor> MakeSources(const ParameterLayout& layout, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<SourceTensor> out;
  int k = 0;
  for (const LayoutEntry& entry : layout.entries()) {
    for (const TensorSlot& slot : entry.tensors) {
      SourceTensor t{slot.hf_name, slot.shape, SafetensorsDtype::kF32, {}, {}};
      std::vector<float> values(slot.num_elements());
      for (float& v : values) v = dist(rng);
      switch (k++ % 3) {
        case 0:
          t.bytes.resize(values.size() * 4);
          std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
          t.expected = values;
          break;
        case 1: {
          t.dtype = SafetensorsDtype::kBF16;
          t.bytes = EncodeBf16(values);
          t.expected.resize(values.size());
          EXPECT_TRUE(ConvertToFloat32(t.dtype, t.bytes, absl::MakeSpan(t.expected)).ok());
          break;
        }
        default: {
          t.dtype = SafetensorsDtype::kF16;
          t.bytes = EncodeF16(values);
          t.expected.resize(values.size());
          EXPECT_TRUE(ConvertToFloat32(t.dtype, t.bytes, absl::MakeSpan(t.expected)).ok());
          break;
        }
      }
      out.push_back(std::move(t));
    }
  }
  return out;
}

TensorToWrite ToWrite(const SourceTensor& t) { return {t.name, t.dtype, t.shape, t.bytes}; }

std::string FreshDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/hf_loader_" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

// Buffers pre-filled with NaN so unwritten floats show up.
struct Buffers {
  explicit Buffers(const ParameterLayout& layout) {
    for (const LayoutEntry& e : layout.entries()) {
      storage.emplace_back(e.num_elements, std::numeric_limits<float>::quiet_NaN());
    }
    for (auto& s : storage) pointers.push_back(s.data());
  }
  std::vector<std::vector<float>> storage;
  std::vector<float*> pointers;
};

void ExpectLoaded(const ParameterLayout& layout, const Buffers& buffers,
                  const std::vector<SourceTensor>& sources) {
  std::map<std::string, const SourceTensor*> by_name;
  for (const auto& s : sources) by_name[s.name] = &s;
  for (int e = 0; e < layout.num_entries(); ++e) {
    const LayoutEntry& entry = layout.entries()[e];
    std::vector<bool> is_param(entry.num_elements, false);
    for (const TensorSlot& slot : entry.tensors) {
      const SourceTensor& src = *by_name.at(slot.hf_name);
      for (size_t i = 0; i < slot.num_elements(); ++i) {
        ASSERT_EQ(buffers.storage[e][slot.offset + i], src.expected[i]) << slot.hf_name << " " << i;
        is_param[slot.offset + i] = true;
      }
    }
    for (size_t i = 0; i < entry.num_elements; ++i) {
      if (!is_param[i]) {
        ASSERT_EQ(buffers.storage[e][i], 0.0f) << "padding of entry " << e << " at " << i;
      }
    }
  }
}

class HfLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto layout = ParameterLayout::Create(TinyLlama(/*tied=*/false));
    ASSERT_TRUE(layout.ok());
    layout_.emplace(std::move(*layout));
    sources_ = MakeSources(*layout_, 7);
  }
  std::vector<TensorToWrite> AllTensors() const {
    std::vector<TensorToWrite> t;
    for (const auto& s : sources_) t.push_back(ToWrite(s));
    return t;
  }
  absl::Status Load(const std::string& dir) {
    buffers_.emplace(*layout_);
    return LoadHfWeights(dir, *layout_, buffers_->pointers);
  }
  std::optional<ParameterLayout> layout_;
  std::vector<SourceTensor> sources_;
  std::optional<Buffers> buffers_;
};

TEST_F(HfLoaderTest, SingleFileLoadsEveryTensorExactly) {
  const std::string dir = FreshDir("single");
  auto tensors = AllTensors();
  const std::vector<float> inv_freq = {1.0f, 0.5f};
  tensors.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq",
                     SafetensorsDtype::kF32,
                     {2},
                     {reinterpret_cast<const uint8_t*>(inv_freq.data()), 8}});
  std::reverse(tensors.begin(), tensors.end());  // file order must not matter
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}}).ok());
  ASSERT_TRUE(Load(dir).ok()) << Load(dir);
  ExpectLoaded(*layout_, *buffers_, sources_);
}

TEST_F(HfLoaderTest, ShardedWithIndex) {
  const std::string dir = FreshDir("sharded");
  auto tensors = AllTensors();
  const size_t half = tensors.size() / 2;
  std::vector<TensorToWrite> first(tensors.begin(), tensors.begin() + half);
  std::vector<TensorToWrite> second(tensors.begin() + half, tensors.end());
  ASSERT_TRUE(WriteSafetensors(dir + "/model-00001-of-00002.safetensors", first).ok());
  ASSERT_TRUE(WriteSafetensors(dir + "/model-00002-of-00002.safetensors", second).ok());
  nlohmann::json index;
  index["metadata"] = {{"total_size", 12345}};
  for (const auto& t : first) index["weight_map"][t.name] = "model-00001-of-00002.safetensors";
  for (const auto& t : second) index["weight_map"][t.name] = "model-00002-of-00002.safetensors";
  WriteFile(dir + "/model.safetensors.index.json", index.dump(2));
  const absl::Status status = Load(dir);
  ASSERT_TRUE(status.ok()) << status;
  ExpectLoaded(*layout_, *buffers_, sources_);

  // A tensor the index places in the other shard.
  auto wrong = index;
  wrong["weight_map"][first[0].name] = "model-00002-of-00002.safetensors";
  WriteFile(dir + "/model.safetensors.index.json", wrong.dump());
  EXPECT_THAT(
      Load(dir).message(),
      HasSubstr("tensor '" + first[0].name +
                "' is in model-00001-of-00002.safetensors but "
                "model.safetensors.index.json maps it to model-00002-of-00002.safetensors"));

  // A tensor the index lists in a shard that lacks it.
  wrong = index;
  wrong["weight_map"]["model.layers.9.mlp.up_proj.weight"] = "model-00002-of-00002.safetensors";
  WriteFile(dir + "/model.safetensors.index.json", wrong.dump());
  EXPECT_THAT(Load(dir).message(),
              HasSubstr("maps tensor 'model.layers.9.mlp.up_proj.weight' here but the file "
                        "lacks it"));

  // A shard file that is missing.
  wrong = index;
  wrong["weight_map"][second[0].name] = "model-00003-of-00003.safetensors";
  WriteFile(dir + "/model.safetensors.index.json", wrong.dump());
  EXPECT_THAT(Load(dir).message(), HasSubstr("model-00003-of-00003.safetensors"));

  // Path traversal in the index.
  wrong = index;
  wrong["weight_map"][second[0].name] = "../evil.safetensors";
  WriteFile(dir + "/model.safetensors.index.json", wrong.dump());
  EXPECT_THAT(Load(dir).message(), HasSubstr("\"../evil.safetensors\" is not a .safetensors file "
                                             "name inside the model directory"));

  // Unlisted tensor in a shard.
  wrong = index;
  wrong["weight_map"].erase(second[1].name);
  WriteFile(dir + "/model.safetensors.index.json", wrong.dump());
  EXPECT_THAT(Load(dir).message(), HasSubstr("tensor '" + second[1].name + "' is not listed in"));

  WriteFile(dir + "/model.safetensors.index.json", "{\"weight_map\": 5}");
  EXPECT_THAT(Load(dir).message(), HasSubstr("'weight_map' is missing or not an object"));
}

TEST_F(HfLoaderTest, MissingTensorIsNamed) {
  const std::string dir = FreshDir("missing");
  auto tensors = AllTensors();
  tensors.erase(tensors.begin() + 5);
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
  const absl::Status s = Load(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensor '" + sources_[5].name + "'"));
  EXPECT_THAT(s.message(), HasSubstr("is missing (1 tensor missing in all)"));
}

TEST_F(HfLoaderTest, WrongShapeNamesExpectedAndActual) {
  const std::string dir = FreshDir("shape");
  auto tensors = AllTensors();
  // q_proj of layer 1 is [10, 10]; store it as [5, 20] (same bytes).
  for (auto& t : tensors) {
    if (t.name == "model.layers.1.self_attn.q_proj.weight") t.shape = {5, 20};
  }
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
  EXPECT_THAT(Load(dir).message(),
              HasSubstr("tensor 'model.layers.1.self_attn.q_proj.weight' has shape [5, 20]; the "
                        "model config expects [10, 10]"));
}

TEST_F(HfLoaderTest, ExtraAndNonFloatTensorsAreRefused) {
  const std::string dir = FreshDir("extra");
  auto tensors = AllTensors();
  const std::vector<float> extra = {1, 2, 3};
  tensors.push_back({"model.layers.0.self_attn.q_norm.weight",
                     SafetensorsDtype::kF32,
                     {3},
                     {reinterpret_cast<const uint8_t*>(extra.data()), 12}});
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
  EXPECT_THAT(Load(dir).message(),
              HasSubstr("unexpected tensor 'model.layers.0.self_attn.q_norm.weight' [3]"));

  tensors = AllTensors();
  const std::vector<int32_t> ints(10, 1);
  for (auto& t : tensors) {
    if (t.name == "model.norm.weight") {
      t.dtype = SafetensorsDtype::kI32;
      t.data = {reinterpret_cast<const uint8_t*>(ints.data()), 40};
    }
  }
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
  EXPECT_THAT(
      Load(dir).message(),
      HasSubstr("tensor 'model.norm.weight' has dtype I32; expected F32, BF16, F16 or F64"));
}

TEST_F(HfLoaderTest, BufferCountMustMatch) {
  std::vector<float*> too_few(2, nullptr);
  EXPECT_THAT(LoadHfWeights(FreshDir("count"), *layout_, too_few).message(),
              HasSubstr("2 entry buffers for a layout of 6 entries"));
}

TEST(HfLoaderTiedTest, LmHeadMustEqualEmbedding) {
  auto layout = ParameterLayout::Create(TinyLlama(/*tied=*/true));
  ASSERT_TRUE(layout.ok());
  const auto sources = MakeSources(*layout, 11);
  const SourceTensor& embed = sources[0];
  ASSERT_EQ(embed.name, "model.embed_tokens.weight");
  const std::string dir = FreshDir("tied");
  std::vector<TensorToWrite> tensors;
  for (const auto& s : sources) tensors.push_back(ToWrite(s));

  // Tied and absent: fine.
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
  Buffers buffers(*layout);
  ASSERT_TRUE(LoadHfWeights(dir, *layout, buffers.pointers).ok());
  ExpectLoaded(*layout, buffers, sources);

  // Present as an exact copy (even in another dtype with the same values): fine.
  std::vector<float> head = embed.expected;
  tensors.push_back({"lm_head.weight",
                     SafetensorsDtype::kF32,
                     embed.shape,
                     {reinterpret_cast<const uint8_t*>(head.data()), head.size() * 4}});
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
  const absl::Status ok = LoadHfWeights(dir, *layout, buffers.pointers);
  EXPECT_TRUE(ok.ok()) << ok;

  // Present but different: refused.
  head[37] = std::nextafter(head[37], 100.0f);
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
  EXPECT_THAT(LoadHfWeights(dir, *layout, buffers.pointers).message(),
              HasSubstr("'lm_head.weight' differs from model.embed_tokens.weight (first at "
                        "element 37)"));

  // Present with the wrong shape: refused.
  tensors.back().shape = {10, 13};
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
  EXPECT_THAT(LoadHfWeights(dir, *layout, buffers.pointers).message(),
              HasSubstr("'lm_head.weight' has shape [10, 13]; the model config expects [13, 10]"));
}

TEST(HfLoaderDirTest, PickleWeightsAreRefusedUnread) {
  auto layout = ParameterLayout::Create(TinyLlama(false));
  ASSERT_TRUE(layout.ok());
  Buffers buffers(*layout);
  for (const char* name : {"pytorch_model.bin", "consolidated.00.pth", "model.pt"}) {
    const std::string dir = FreshDir(std::string("pickle_") + name);
    WriteFile(dir + "/" + name, "\x80\x02 not really a pickle");
    WriteFile(dir + "/config.json", "{}");
    const absl::Status s = LoadHfWeights(dir, *layout, buffers.pointers);
    EXPECT_EQ(s.message(), dir + "/" + name +
                               ": pickle-based weights are not loaded (they can execute code); "
                               "convert to safetensors");
  }
  // A sharded pickle index pointing at .bin shards is refused the same way.
  const std::string dir = FreshDir("pickle_index");
  WriteFile(dir + "/model.safetensors.index.json",
            R"({"weight_map": {"model.norm.weight": "pytorch_model-00001-of-00002.bin"}})");
  EXPECT_THAT(LoadHfWeights(dir, *layout, buffers.pointers).message(),
              HasSubstr("pytorch_model-00001-of-00002.bin: pickle-based weights are not loaded"));

  const std::string empty = FreshDir("empty");
  EXPECT_EQ(LoadHfWeights(empty, *layout, buffers.pointers).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(LoadHfWeights(empty + "/nope", *layout, buffers.pointers).code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace megatrain::engine
