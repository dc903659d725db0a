// DaemonMetrics: a job's per-layer and per-block label sets exist while it runs and are removed
// when it ends (issue 16, point 9), so the next job of another shape exports only its own.
#include "server/metrics.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"

namespace megatrain::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

engine::StepReport Report(int layers, int blocks) {
  engine::StepReport report;
  report.step = 1;
  report.layers.resize(static_cast<size_t>(layers));
  for (int b = 0; b < blocks; ++b) report.activation_blocks.push_back({b, 1, "keep", "fits"});
  return report;
}

TEST(DaemonMetricsTest, EndJobRemovesThePerLayerAndPerBlockSeries) {
  prometheus::Registry registry;
  DaemonMetrics metrics(registry);
  auto text = [&] { return prometheus::TextSerializer().Serialize(registry.Collect()); };
  metrics.RecordStep(Report(3, 2), 1.0);
  EXPECT_THAT(text(), HasSubstr("megatrain_layer_compute_seconds_count{layer=\"2\"}"));
  EXPECT_THAT(text(), HasSubstr("megatrain_layer_overlap_ratio{layer=\"2\"}"));
  EXPECT_THAT(text(), HasSubstr("megatrain_activation_block_mode{block=\"1\",mode=\"keep\"}"));
  metrics.EndJob();
  EXPECT_THAT(text(), Not(HasSubstr("layer=\"")));
  EXPECT_THAT(text(), Not(HasSubstr("block=\"")));
  EXPECT_THAT(text(), HasSubstr("megatrain_train_steps_total 1"));  // daemon-wide series stay
  metrics.RecordStep(Report(1, 0), 1.0);  // the next job, of another shape
  EXPECT_THAT(text(), HasSubstr("megatrain_layer_compute_seconds_count{layer=\"0\"} 1"));
  EXPECT_THAT(text(), Not(HasSubstr("layer=\"1\"")));
}

}  // namespace
}  // namespace megatrain::server
