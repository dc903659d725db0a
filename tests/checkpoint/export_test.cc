// Hugging Face export: a model exported from the engine (fp32, single or
// sharded, and bf16) reloads through the HF loader with the same config, and
// its logits equal the committed float64-reference logits of the golden
// fixtures (tests/golden) within the golden test's tolerance, and the
// exporting trainer's logits bitwise. A trained model exports too.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "engine/checkpoint/checkpoint_writer.h"
#include "engine/train/trainer.h"
#include "tests/checkpoint/export_util.h"

namespace megatrain::engine {
namespace {

namespace fs = std::filesystem;
using testing::GoldenRun;
using testing::LoadGolden;

class ExportTest : public ::testing::TestWithParam<const char*> {};

std::vector<float> Logits(Trainer& t, const GoldenRun& r) {
  auto logits = t.Logits(r.input_ids.data());
  EXPECT_TRUE(logits.ok()) << logits.status();
  return logits.ok() ? *logits : std::vector<float>();
}

TEST_P(ExportTest, ExportedModelReloadsWithTheCommittedLogits) {
  const std::string fixture = absl::StrCat("tests/golden/", GetParam());
  auto source = LoadGolden(fixture);
  ASSERT_TRUE(source.ok()) << source.status();
  const std::vector<float> source_logits = Logits(*source->trainer, *source);
  const std::string root = absl::StrCat(::testing::TempDir(), "/export_", GetParam());
  fs::remove_all(root);
  fs::create_directories(root);

  struct Variant {
    std::string name;
    SafetensorsDtype dtype;
    uint64_t shard;
  };
  for (const Variant& v : {Variant{"fp32", SafetensorsDtype::kF32, 0},
                           Variant{"fp32_sharded", SafetensorsDtype::kF32, 40000},
                           Variant{"bf16", SafetensorsDtype::kBF16, 0}}) {
    const std::string dir = absl::StrCat(root, "/", v.name);
    ASSERT_TRUE(ExportHfModel(*source->trainer, dir, v.dtype, v.shard).ok()) << v.name;
    EXPECT_EQ(fs::exists(dir + "/model.safetensors.index.json"), v.shard > 0) << v.name;
    auto config = LoadModelConfig(dir + "/config.json");
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_TRUE(*config == source->trainer->config()) << v.name;

    auto reloaded = LoadGolden(fixture);  // fresh trainer, then the exported weights
    ASSERT_TRUE(reloaded.ok());
    ASSERT_TRUE(reloaded->trainer->LoadHfWeights(dir).ok()) << v.name;
    const std::vector<float> got = Logits(*reloaded->trainer, *reloaded);
    ASSERT_EQ(got.size(), source->initial_logits.size());
    if (v.dtype == SafetensorsDtype::kF32) {
      EXPECT_EQ(got, source_logits) << v.name << ": fp32 export is not lossless";
      for (size_t i = 0; i < got.size(); ++i) {
        // The golden test's bound: ~3x HF's own fp32 deviation from float64.
        ASSERT_NEAR(got[i], source->initial_logits[i], 2e-5) << v.name << " logit " << i;
      }
    } else {
      // bf16 keeps 8 bits of mantissa: each weight moves by up to 2^-9
      // relative; through two layers the logits move by about a percent of
      // their range. A wrong tensor order or shape would move them by O(1).
      double max_diff = 0, max_logit = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        max_diff = std::max(max_diff, std::fabs(static_cast<double>(got[i]) - source_logits[i]));
        max_logit = std::max(max_logit, std::fabs(static_cast<double>(source_logits[i])));
      }
      EXPECT_GT(max_diff, 0.0);
      EXPECT_LT(max_diff, 0.03 * max_logit) << v.name;
    }
  }

  // After training: the export carries the trained weights exactly.
  ASSERT_TRUE(TrainGoldenSteps(*source).ok());
  const std::vector<float> trained_logits = Logits(*source->trainer, *source);
  const std::string dir = root + "/trained";
  ASSERT_TRUE(ExportHfModel(*source->trainer, dir).ok());
  auto reloaded = LoadGolden(fixture);
  ASSERT_TRUE(reloaded.ok());
  ASSERT_TRUE(reloaded->trainer->LoadHfWeights(dir).ok());
  EXPECT_EQ(Logits(*reloaded->trainer, *reloaded), trained_logits);
  EXPECT_NE(trained_logits, source_logits);
  EXPECT_FALSE(ExportHfModel(*source->trainer, dir).ok()) << "must refuse an existing directory";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ExportTest, ::testing::Values("llama_tiny", "qwen2_tiny", "qwen3_tiny"));

}  // namespace
}  // namespace megatrain::engine
