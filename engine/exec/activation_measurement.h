// Measures what the activation policy decides from (link bandwidth each way,
// a layer's forward and backward compute) out of a step's timeline spans.
#pragma once

#include <string_view>
#include <vector>

#include "engine/device/timeline.h"
#include "engine/exec/activation_policy.h"

namespace megatrain::engine {

// What the executor enqueued over the measured micro-batches: bytes of the
// layer weight copies and activation fetches (in), of the layer gradient
// copies and activation offloads (out), and the layer ops it ran.
struct LayerTraffic {
  double copy_in_bytes = 0;
  double copy_out_bytes = 0;
  int forward_ops = 0;  // first forwards and recomputes
  int backward_ops = 0;
};

// Timeline labels of the activation copies (the layer ops' are DescribeOp's).
inline constexpr std::string_view kOffloadLabel = "act.out";
inline constexpr std::string_view kFetchLabel = "act.in";

// Bandwidth = bytes / time of the matching copy spans (copy_in: "layer.*" and
// act.in; copy_out: "layer.bwd.*" and act.out), compute = span time / ops.
// A quantity without spans or bytes stays 0 (unmeasured).
ActivationMeasurement MeasureFromSpans(const std::vector<TimelineSpan>& spans,
                                       const LayerTraffic& traffic);

}  // namespace megatrain::engine
