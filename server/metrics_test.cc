// DaemonMetrics: a job's per-layer and per-block label sets exist while it runs and are removed
// when it ends (issue 16, point 9), so the next job of another shape exports only its own; the
// per-device figures carry a rank label (several devices in one process).
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

TEST(DaemonMetricsTest, PerDeviceFiguresCarryARankLabelUntilTheJobEnds) {
  prometheus::Registry registry;
  DaemonMetrics metrics(registry);
  auto text = [&] { return prometheus::TextSerializer().Serialize(registry.Collect()); };
  engine::StepReport report = Report(2, 0);
  report.devices = {{.stall_seconds = 0.5, .link_bytes = 1000},
                    {.stall_seconds = 2, .link_bytes = 3000}};
  metrics.RecordStep(report, 1.0);
  metrics.RecordStep(report, 1.0);
  EXPECT_THAT(text(), HasSubstr("megatrain_device_stall_seconds_sum{rank=\"0\"} 1"));
  EXPECT_THAT(text(), HasSubstr("megatrain_device_stall_seconds_sum{rank=\"1\"} 4"));
  EXPECT_THAT(text(), HasSubstr("megatrain_device_link_bytes_total{rank=\"1\"} 6000"));
  EXPECT_THAT(text(), HasSubstr("megatrain_device_compute_seconds_count{rank=\"0\"} 2"));
  // Per-layer series stay job-wide: no rank on them.
  EXPECT_THAT(text(), HasSubstr("megatrain_layer_stall_seconds_count{layer=\"1\"} 2"));
  metrics.EndJob();
  EXPECT_THAT(text(), Not(HasSubstr("rank=\"")));
}

}  // namespace
}  // namespace megatrain::server
