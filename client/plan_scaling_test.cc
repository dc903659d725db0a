// `megatrain plan --scaling` output: the built-in tiny model on h100-sxm, one row per shape
// (1, 2, 4, 8 devices, 2 and 4 nodes of 8, and the spec's own devices), in text and JSON.
#include "client/plan_scaling.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace megatrain::client {
namespace {

using ::testing::HasSubstr;

v1::JobSpec TinySpec() {
  const std::string text = std::string(std::getenv("TEST_TMPDIR")) + "/corpus.txt";
  std::ofstream(text) << std::string(4096, 'x') << "\n";
  v1::JobSpec spec;
  spec.mutable_model()->set_config_json_path("builtin:tiny");
  spec.mutable_data()->add_text_files(text);
  spec.mutable_hyper()->set_steps(10);
  spec.mutable_hyper()->set_seq_len(128);
  spec.mutable_hyper()->set_batch_size(8);
  spec.mutable_hyper()->set_micro_batch_size(4);
  return spec;
}

TEST(PlanScalingTest, TextHasOneRowPerShapeAndTheSpecsDevices) {
  v1::JobSpec spec = TinySpec();
  spec.set_devices(3);  // beyond the daemon's one device: predicted, not refused
  absl::StatusOr<std::string> text = PlanScalingText(spec, "", "h100-sxm", /*json=*/false);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_THAT(*text, HasSubstr("hardware h100-sxm: NVIDIA H100 SXM5"));
  // The tiny model: micro-batch 4 x 128 tokens, 2 micro-batches = 1024 tokens per device.
  EXPECT_THAT(*text, HasSubstr("one device: "));
  EXPECT_THAT(*text, HasSubstr(" 1024 tokens/step"));
  EXPECT_THAT(*text, HasSubstr("efficiency"));
  EXPECT_THAT(*text, HasSubstr("\n      1     1         1024      "));
  EXPECT_THAT(*text, HasSubstr("\n      8     1         8192      "));
  EXPECT_THAT(*text, HasSubstr("\n     32     4        32768      "));
  EXPECT_THAT(*text, HasSubstr("\n      3     1         3072      "));
  EXPECT_THAT(*text, HasSubstr("not measured"));
}

TEST(PlanScalingTest, JsonCarriesEveryRowWithEfficiencyOneAtOneDevice) {
  absl::StatusOr<std::string> text = PlanScalingText(TinySpec(), "", "h100-pcie", /*json=*/true);
  ASSERT_TRUE(text.ok()) << text.status();
  const nlohmann::json j = nlohmann::json::parse(*text);
  EXPECT_EQ(j["hardware"], "h100-pcie");
  ASSERT_EQ(j["data_parallel"].size(), 6u);
  EXPECT_EQ(j["data_parallel"][0]["devices"], 1);
  EXPECT_DOUBLE_EQ(j["data_parallel"][0]["efficiency"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["data_parallel"][0]["tokens_per_second"].get<double>(),
                   j["one_device"]["tokens_per_second"].get<double>());
  EXPECT_EQ(j["data_parallel"][3]["devices"], 8);
  EXPECT_FALSE(j["data_parallel"][3]["bottleneck"].get<std::string>().empty());
}

TEST(PlanScalingTest, AnUnknownProfileIsRefusedListingTheKnownOnes) {
  absl::StatusOr<std::string> text = PlanScalingText(TinySpec(), "", "h900", /*json=*/false);
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(text.status().message(), HasSubstr("h100-sxm"));
}

}  // namespace
}  // namespace megatrain::client
