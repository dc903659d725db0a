// The activation policy's pipeline model, greedy choice and hysteresis.
#include "engine/exec/activation_policy.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace megatrain::engine {
namespace {

int Blocks(const ActivationCosts& c) {
  return (c.num_layers + c.checkpoint_interval - 1) / c.checkpoint_interval;
}

std::string Megabytes(double bytes) { return absl::StrFormat("%.1f MB", bytes / 1e6); }
std::string GigabytesPerSecond(double bps) { return absl::StrFormat("%.2f GB/s", bps / 1e9); }
std::string Milliseconds(double seconds) { return absl::StrFormat("%.2f ms", seconds * 1e3); }

}  // namespace

const char* ActivationPolicyName(ActivationPolicyKind kind) {
  switch (kind) {
    case ActivationPolicyKind::kRecompute:
      return "recompute";
    case ActivationPolicyKind::kOffload:
      return "offload";
    case ActivationPolicyKind::kAdaptive:
      return "adaptive";
  }
  return "?";
}

absl::StatusOr<ActivationPolicyKind> ParseActivationPolicy(std::string_view name) {
  for (ActivationPolicyKind kind :
       {ActivationPolicyKind::kRecompute, ActivationPolicyKind::kOffload,
        ActivationPolicyKind::kAdaptive}) {
    if (name == ActivationPolicyName(kind)) return kind;
  }
  return absl::InvalidArgumentError(absl::StrCat("activation policy '", std::string(name),
                                                 "' is not one of recompute, offload, adaptive"));
}

std::vector<ActivationMode> ActivationDecision::modes() const {
  std::vector<ActivationMode> m;
  for (const BlockDecision& b : blocks) m.push_back(b.mode);
  return m;
}

double PredictLayerSeconds(const ActivationCosts& c, const ActivationMeasurement& m,
                           const std::vector<ActivationMode>& modes) {
  ScheduleShape shape;
  shape.num_layers = c.num_layers;
  shape.checkpoint_interval = c.checkpoint_interval;
  shape.first_layer_entry = 1;
  shape.final_norm_entry = c.num_layers + 1;
  shape.lm_head_entry = c.num_layers + 2;
  shape.block_modes = modes;
  const std::vector<ScheduledOp> ops = BuildStepSchedule(shape);
  const double weights_in = c.weight_bytes / m.copy_in_bytes_per_second;
  const double set_in = c.activation_set_bytes / m.copy_in_bytes_per_second;
  const double set_out = c.activation_set_bytes / m.copy_out_bytes_per_second;
  const double gradients_out = c.gradient_bytes / m.copy_out_bytes_per_second;

  // Replays the executor's protocol on three in-order streams with two weight
  // slots; times are when each stream becomes free.
  double copy_in = 0, compute = 0, copy_out = 0, last_offload = 0;
  std::vector<double> compute_end(ops.size(), 0);
  std::vector<double> gradients_done;
  std::vector<double> set_out_done(static_cast<size_t>(ActivationSetCount(shape)) + 1, 0);
  std::vector<double> set_in_ready(set_out_done.size(), 0);
  std::vector<std::pair<ActivationFetch, double>> pending;  // fetch, gate time
  for (size_t j = 0; j < ops.size(); ++j) {
    const ScheduledOp& op = ops[j];
    if (op.kind != StageKind::kLayerForward && op.kind != StageKind::kLayerBackward) {
      compute_end[j] = compute;  // the model leaves out embedding and head
      continue;
    }
    double weights_ready = copy_in;
    const bool reuse = j > 0 && ops[j - 1].entries == op.entries;
    if (!reuse) {
      const double slot_free = j >= 2 ? compute_end[j - 2] : 0;
      copy_in = std::max(copy_in, slot_free) + weights_in;
      weights_ready = copy_in;
    }
    for (const auto& [fetch, gate] : pending) {
      copy_in = std::max({copy_in, gate, last_offload}) + set_in;
      set_in_ready[fetch.set] = copy_in;
    }
    pending.clear();
    double start = std::max(compute, weights_ready);
    if (op.kind == StageKind::kLayerForward) {
      start = std::max(start, set_out_done[op.save_activations ? op.activation_set : 0]);
    }
    if (op.fetched_activations) start = std::max(start, set_in_ready[op.activation_set]);
    const bool backward = op.kind == StageKind::kLayerBackward;
    // Two gradient buffers: a backward waits for the copy-out two before it.
    if (backward && gradients_done.size() >= 2) {
      start = std::max(start, gradients_done[gradients_done.size() - 2]);
    }
    compute = start + (backward ? m.backward_seconds : m.forward_seconds);
    compute_end[j] = compute;
    if (backward) {
      copy_out = std::max(copy_out, compute) + gradients_out;
      gradients_done.push_back(copy_out);
    }
    if (op.offload_activations) {
      copy_out = std::max(copy_out, compute) + set_out;
      set_out_done[op.activation_set] = copy_out;
      last_offload = copy_out;
    }
    for (const ActivationFetch& f : op.fetch_after) pending.push_back({f, compute});
  }
  return std::max({copy_in, compute, copy_out});
}

ActivationDecision DecideActivationModes(ActivationPolicyKind kind, const ActivationCosts& c,
                                         const ActivationMeasurement& m) {
  return DescribeActivationModes(kind, c, m, ChooseActivationModes(kind, c, m));
}

std::vector<ActivationMode> ChooseActivationModes(ActivationPolicyKind kind,
                                                  const ActivationCosts& c,
                                                  const ActivationMeasurement& m) {
  const int blocks = Blocks(c);
  const int below_top = std::max(0, blocks - 1);
  const int keep = std::min(std::max(0, c.keep_capacity_blocks), below_top);
  const ActivationMode rest = kind == ActivationPolicyKind::kOffload ? ActivationMode::kOffload
                                                                     : ActivationMode::kRecompute;
  std::vector<ActivationMode> modes(static_cast<size_t>(blocks), rest);
  if (blocks > 0) modes[blocks - 1] = ActivationMode::kKeep;
  // The blocks nearest the top keep: their backward comes first.
  for (int b = below_top - keep; b < below_top; ++b) modes[b] = ActivationMode::kKeep;

  const bool measured = m.complete();
  if (kind == ActivationPolicyKind::kAdaptive && measured) {
    double best = PredictLayerSeconds(c, m, modes);
    for (;;) {
      int flip = -1;
      for (int b = 0; b < below_top - keep; ++b) {
        std::vector<ActivationMode> trial = modes;
        trial[b] = trial[b] == ActivationMode::kOffload ? ActivationMode::kRecompute
                                                        : ActivationMode::kOffload;
        const double t = PredictLayerSeconds(c, m, trial);
        if (t < best * (1 - 1e-9)) {
          best = t;
          flip = b;
        }
      }
      if (flip < 0) break;
      modes[flip] = modes[flip] == ActivationMode::kOffload ? ActivationMode::kRecompute
                                                            : ActivationMode::kOffload;
    }
  }
  return modes;
}

ActivationDecision DescribeActivationModes(ActivationPolicyKind kind, const ActivationCosts& c,
                                           const ActivationMeasurement& m,
                                           const std::vector<ActivationMode>& modes) {
  const int blocks = Blocks(c);
  const int k = c.checkpoint_interval;
  const int below_top = std::max(0, blocks - 1);
  const int keep = std::min(std::max(0, c.keep_capacity_blocks), below_top);
  const bool measured = m.complete();
  ActivationDecision d;
  d.basis = m;
  d.predicted_seconds = measured ? PredictLayerSeconds(c, m, modes) : 0;
  for (int b = 0; b < blocks; ++b) {
    BlockDecision block;
    block.first_layer = b * k;
    block.num_layers = std::min(k, c.num_layers - b * k);
    block.mode = modes[b];
    if (b == blocks - 1) {
      block.reason = "keep: top block (its backward follows the head)";
    } else if (modes[b] == ActivationMode::kKeep) {
      block.reason = absl::StrCat("keep: within the activation budget (", keep, " of ", below_top,
                                  " blocks below the top)");
    } else if (!measured) {
      block.reason = absl::StrCat(ActivationModeName(modes[b]), ": policy ",
                                  ActivationPolicyName(kind), ", no measurement yet");
    } else {
      std::vector<ActivationMode> trial = modes;
      trial[b] = ActivationMode::kKeep;
      const double kept = PredictLayerSeconds(c, m, trial);
      trial[b] = ActivationMode::kOffload;
      const double offload = PredictLayerSeconds(c, m, trial) - kept;
      trial[b] = ActivationMode::kRecompute;
      const double recompute = PredictLayerSeconds(c, m, trial) - kept;
      const std::string copies =
          absl::StrCat(block.num_layers, " x ", Megabytes(c.activation_set_bytes), " out at ",
                       GigabytesPerSecond(m.copy_out_bytes_per_second), ", in at ",
                       GigabytesPerSecond(m.copy_in_bytes_per_second));
      const std::string recompute_text =
          absl::StrCat(block.num_layers, " x ", Milliseconds(m.forward_seconds), " compute + ",
                       Megabytes(c.weight_bytes), " weights");
      const bool offloads = modes[b] == ActivationMode::kOffload;
      const char* relation =
          offloads ? (offload <= recompute ? "<=" : ">") : (recompute <= offload ? "<=" : ">");
      block.reason =
          offloads ? absl::StrCat("offload: ", copies, " = +", Milliseconds(offload), " ", relation,
                                  " recompute +", Milliseconds(recompute))
                   : absl::StrCat("recompute: ", recompute_text, " = +", Milliseconds(recompute),
                                  " ", relation, " offload +", Milliseconds(offload));
      if (kind != ActivationPolicyKind::kAdaptive) {
        absl::StrAppend(&block.reason, " (policy ", ActivationPolicyName(kind), ")");
      }
    }
    d.blocks.push_back(std::move(block));
  }
  return d;
}

bool MeasurementDrifted(const ActivationMeasurement& basis, const ActivationMeasurement& now,
                        double threshold) {
  const double pairs[4][2] = {
      {basis.copy_in_bytes_per_second, now.copy_in_bytes_per_second},
      {basis.copy_out_bytes_per_second, now.copy_out_bytes_per_second},
      {basis.forward_seconds, now.forward_seconds},
      {basis.backward_seconds, now.backward_seconds},
  };
  for (const auto& p : pairs) {
    if (p[1] <= 0) continue;  // not measured this time
    if (p[0] <= 0) return true;
    if (std::abs(p[1] / p[0] - 1) > threshold) return true;
  }
  return false;
}

ActivationPolicy::ActivationPolicy(ActivationPolicyKind kind, const ActivationCosts& costs,
                                   double drift_threshold, double min_gain)
    : kind_(kind),
      costs_(costs),
      drift_threshold_(drift_threshold),
      min_gain_(min_gain),
      decision_(DecideActivationModes(kind, costs, ActivationMeasurement{})) {}

bool ActivationPolicy::Observe(const ActivationMeasurement& measured) {
  if (!MeasurementDrifted(decision_.basis, measured, drift_threshold_)) return false;
  // Unmeasured fields keep their last value.
  ActivationMeasurement merged = decision_.basis;
  if (measured.copy_in_bytes_per_second > 0) {
    merged.copy_in_bytes_per_second = measured.copy_in_bytes_per_second;
  }
  if (measured.copy_out_bytes_per_second > 0) {
    merged.copy_out_bytes_per_second = measured.copy_out_bytes_per_second;
  }
  if (measured.forward_seconds > 0) merged.forward_seconds = measured.forward_seconds;
  if (measured.backward_seconds > 0) merged.backward_seconds = measured.backward_seconds;
  const std::vector<ActivationMode> before = decision_.modes();
  std::vector<ActivationMode> chosen = ChooseActivationModes(kind_, costs_, merged);
  // Second hysteresis: a change of modes must be predicted to pay off by
  // more than min_gain under the new measurement (the first decision from a
  // measurement always applies).
  if (chosen != before && decision_.basis.complete() && merged.complete() &&
      PredictLayerSeconds(costs_, merged, chosen) >
          PredictLayerSeconds(costs_, merged, before) * (1 - min_gain_)) {
    chosen = before;
  }
  decision_ = DescribeActivationModes(kind_, costs_, merged, chosen);
  return chosen != before;
}

}  // namespace megatrain::engine
