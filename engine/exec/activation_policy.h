// Adaptive recomputation: picks, per block of layers, whether its activations
// are kept on the device, offloaded to host memory or recomputed, from the
// measured link bandwidth and layer compute, with a small pipeline model.
//
// The model (one micro-batch, layers only) replays the step schedule the
// modes give on three in-order streams, as the executor runs it: copy_in
// streams each layer's weights into one of two slots (a recomputed block
// streams them again) and fetches offloaded sets once their working set is
// free, compute runs forwards and backwards, copy_out takes gradients and
// offloaded sets; a forward waits for the copy-out of the set it overwrites.
// So offloading is free while copy_out keeps up behind compute, and costs
// link time once it does not; recompute costs compute and weight traffic.
// KEEP goes to the blocks nearest the top while the budget lasts; the rest
// start as recompute and greedily switch to offload one block at a time while
// the predicted time drops, so a balanced link can get a mix.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/exec/step_schedule.h"

namespace megatrain::engine {

enum class ActivationPolicyKind { kRecompute, kOffload, kAdaptive };

// "recompute", "offload", "adaptive".
const char* ActivationPolicyName(ActivationPolicyKind kind);
absl::StatusOr<ActivationPolicyKind> ParseActivationPolicy(std::string_view name);

// What steps measured; 0 = not measured.
struct ActivationMeasurement {
  double copy_in_bytes_per_second = 0;
  double copy_out_bytes_per_second = 0;
  double forward_seconds = 0;   // one layer's forward of one micro-batch
  double backward_seconds = 0;  // one layer's backward of one micro-batch
  bool complete() const {
    return copy_in_bytes_per_second > 0 && copy_out_bytes_per_second > 0 && forward_seconds > 0 &&
           backward_seconds > 0;
  }
};

// The sizes the decision depends on (fixed for an executor).
struct ActivationCosts {
  int num_layers = 0;
  int checkpoint_interval = 1;
  int keep_capacity_blocks = 0;  // blocks below the top the activation budget can keep
  double weight_bytes = 0;       // a layer's weights, copied in per layer stage
  double gradient_bytes = 0;     // a layer's gradients, copied out per backward
  double activation_set_bytes = 0;
};

struct BlockDecision {
  int first_layer = 0;
  int num_layers = 0;
  ActivationMode mode = ActivationMode::kRecompute;
  std::string reason;
};

struct ActivationDecision {
  std::vector<BlockDecision> blocks;  // bottom-up; the top block last, always kKeep
  ActivationMeasurement basis;        // what it was decided from
  double predicted_seconds = 0;       // modeled layer time of one micro-batch; 0 unmeasured
  // One mode per block, in ScheduleShape::block_modes form.
  std::vector<ActivationMode> modes() const;
};

// The modeled layer time of one micro-batch under `modes` (one per block; the
// top block's ignored). Needs a complete measurement.
double PredictLayerSeconds(const ActivationCosts& costs, const ActivationMeasurement& measured,
                           const std::vector<ActivationMode>& modes);

// KEEP for the top block and for up to keep_capacity_blocks blocks below it;
// the rest all recompute / all offload for the fixed kinds, and for adaptive
// the greedy choice (all recompute while the measurement is incomplete).
ActivationDecision DecideActivationModes(ActivationPolicyKind kind, const ActivationCosts& costs,
                                         const ActivationMeasurement& measured);
// The two halves of DecideActivationModes: the modes, and the decision (with
// per-block reasons and the prediction) for given modes.
std::vector<ActivationMode> ChooseActivationModes(ActivationPolicyKind kind,
                                                  const ActivationCosts& costs,
                                                  const ActivationMeasurement& measured);
ActivationDecision DescribeActivationModes(ActivationPolicyKind kind, const ActivationCosts& costs,
                                           const ActivationMeasurement& measured,
                                           const std::vector<ActivationMode>& modes);

// Whether any measured field moved more than `threshold` (relative) from the
// basis, or was unmeasured in the basis and is measured now.
bool MeasurementDrifted(const ActivationMeasurement& basis, const ActivationMeasurement& now,
                        double threshold);

// The decision over time: re-decided only when a measurement drifts past the
// threshold from the one the current decision used (hysteresis: noise below
// it never flips a block), and then the modes change only when the new ones
// are predicted faster by more than min_gain (a shifted measurement that
// barely favours other modes does not flap them).
class ActivationPolicy {
 public:
  ActivationPolicy(ActivationPolicyKind kind, const ActivationCosts& costs, double drift_threshold,
                   double min_gain = 0.02);

  const ActivationDecision& decision() const { return decision_; }
  ActivationPolicyKind kind() const { return kind_; }
  // Returns whether the modes changed.
  bool Observe(const ActivationMeasurement& measured);

 private:
  ActivationPolicyKind kind_;
  ActivationCosts costs_;
  double drift_threshold_;
  double min_gain_;
  ActivationDecision decision_;
};

}  // namespace megatrain::engine
