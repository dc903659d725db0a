// Sums the timeline spans of layer copies and layer compute.
#include "engine/exec/activation_measurement.h"

namespace megatrain::engine {
namespace {

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

double Ratio(double a, double b) { return a > 0 && b > 0 ? a / b : 0; }

}  // namespace

ActivationMeasurement MeasureFromSpans(const std::vector<TimelineSpan>& spans,
                                       const LayerTraffic& traffic) {
  double in_seconds = 0, out_seconds = 0, forward_seconds = 0, backward_seconds = 0;
  for (const TimelineSpan& span : spans) {
    const double seconds = static_cast<double>(span.end_ns - span.begin_ns) * 1e-9;
    const std::string_view label = span.label;
    switch (span.kind) {
      case SpanKind::kCopyIn:
        if (StartsWith(label, "layer.") || label == kFetchLabel) in_seconds += seconds;
        break;
      case SpanKind::kCopyOut:
        if (StartsWith(label, "layer.bwd.") || label == kOffloadLabel) out_seconds += seconds;
        break;
      case SpanKind::kCompute:
        if (StartsWith(label, "layer.fwd.") || StartsWith(label, "layer.recompute.")) {
          forward_seconds += seconds;
        } else if (StartsWith(label, "layer.bwd.")) {
          backward_seconds += seconds;
        }
        break;
      default:
        break;
    }
  }
  ActivationMeasurement m;
  m.copy_in_bytes_per_second = Ratio(traffic.copy_in_bytes, in_seconds);
  m.copy_out_bytes_per_second = Ratio(traffic.copy_out_bytes, out_seconds);
  m.forward_seconds = Ratio(forward_seconds, traffic.forward_ops);
  m.backward_seconds = Ratio(backward_seconds, traffic.backward_ops);
  return m;
}

}  // namespace megatrain::engine
