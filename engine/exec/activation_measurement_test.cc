// Tests the measurement: bandwidth from the layer copies' spans and bytes,
// compute per op, other spans ignored, unmeasured quantities left at 0.
#include "engine/exec/activation_measurement.h"

#include <gtest/gtest.h>

namespace megatrain::engine {
namespace {

TimelineSpan Span(SpanKind kind, const std::string& label, int64_t ms) {
  return TimelineSpan{"s", kind, label, 0, 0, ms * 1'000'000};
}

TEST(ActivationMeasurementTest, BandwidthAndComputeFromLayerSpans) {
  const std::vector<TimelineSpan> spans = {
      Span(SpanKind::kCopyIn, "layer.fwd.0", 10),
      Span(SpanKind::kCopyIn, "act.in", 30),
      Span(SpanKind::kCopyIn, "embed.fwd", 500),
      Span(SpanKind::kCopyIn, "head", 500),
      Span(SpanKind::kCopyOut, "layer.bwd.0", 20),
      Span(SpanKind::kCopyOut, "act.out", 20),
      Span(SpanKind::kCopyOut, "accumulate gradients", 900),
      Span(SpanKind::kCompute, "layer.fwd.0", 3),
      Span(SpanKind::kCompute, "layer.recompute.0", 5),
      Span(SpanKind::kCompute, "layer.bwd.0", 7),
      Span(SpanKind::kCompute, "checkpoint", 100),
      Span(SpanKind::kWait, "layer.bwd.0", 1000),
  };
  LayerTraffic traffic;
  traffic.copy_in_bytes = 4e6;   // over 40 ms
  traffic.copy_out_bytes = 2e6;  // over 40 ms
  traffic.forward_ops = 2;
  traffic.backward_ops = 1;
  const ActivationMeasurement m = MeasureFromSpans(spans, traffic);
  EXPECT_DOUBLE_EQ(m.copy_in_bytes_per_second, 1e8);
  EXPECT_DOUBLE_EQ(m.copy_out_bytes_per_second, 5e7);
  EXPECT_DOUBLE_EQ(m.forward_seconds, 4e-3);
  EXPECT_DOUBLE_EQ(m.backward_seconds, 7e-3);
  EXPECT_TRUE(m.complete());
}

TEST(ActivationMeasurementTest, NoCopiesLeavesBandwidthUnmeasured) {
  const std::vector<TimelineSpan> spans = {Span(SpanKind::kCompute, "layer.fwd.0", 3)};
  LayerTraffic traffic;
  traffic.forward_ops = 1;
  const ActivationMeasurement m = MeasureFromSpans(spans, traffic);
  EXPECT_EQ(m.copy_in_bytes_per_second, 0);
  EXPECT_EQ(m.copy_out_bytes_per_second, 0);
  EXPECT_DOUBLE_EQ(m.forward_seconds, 3e-3);
  EXPECT_EQ(m.backward_seconds, 0);
  EXPECT_FALSE(m.complete());
}

}  // namespace
}  // namespace megatrain::engine
