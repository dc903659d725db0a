// What one optimizer step reports: loss, norm, learning rate, throughput and
// the per-layer transfer/compute overlap figures the daemon exports.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace megatrain::engine {

// Seconds spent per layer (or per entry stage) in one step, summed over its
// micro-batches. stall = time the compute stream waited for that layer's
// weights, checkpoints or gradient buffers.
struct LayerTiming {
  double copy_in_seconds = 0;
  double compute_seconds = 0;
  double copy_out_seconds = 0;
  double stall_seconds = 0;
  double optimizer_seconds = 0;  // the layer's AdamW update that preceded this step
  // 1 - stall / copy_in (1 when nothing was copied): how much of the copy was hidden.
  double overlap_ratio() const;
};

// How one block of layers got its activations back for backward in the step
// (adaptive recomputation): "keep", "offload" or "recompute", and why.
struct ActivationBlockReport {
  int first_layer = 0;
  int num_layers = 0;
  std::string mode;
  std::string reason;
};

// Several devices in one process (docs/scale_out.md): what one device did in
// the step. Seconds from its timeline (zero when the timeline is not collected).
struct DeviceStepFigures {
  double stall_seconds = 0;  // its compute stream waited (exposed transfer)
  double copy_in_seconds = 0;
  double compute_seconds = 0;
  // Its copy_out stream waited for gradient turns (earlier micro-batches' contributions on other
  // devices): the "gradient turn" waits of engine/exec/gradient_turns.h. 0 with one device.
  double turn_wait_seconds = 0;
  // Its copy_out stream's reduce-scatters (gradient_reduction=devices): the summing and any wait
  // for peers. 0 otherwise.
  double reduce_seconds = 0;
  uint64_t link_bytes = 0;  // decoder layers' bytes over its host link, both directions
  int micro_batches = 0;
};

struct StepReport {
  uint64_t step = 0;  // 1-based
  double loss = 0;    // mean over valid target tokens of the step
  int64_t valid_tokens = 0;
  int64_t tokens = 0;    // processed tokens (inputs)
  double grad_norm = 0;  // before clipping
  double clip_coefficient = 1;
  // The coefficient the previous-norm clip rule planned before the step (0: none planned; the
  // exact rule plans none); clip_coefficient equals it when the plan was applied.
  double planned_clip_coefficient = 0;
  double learning_rate = 0;
  bool skipped = false;  // non-finite gradient norm: no update
  // Speculative update (TrainerOptions::speculative_update): entries updated during the last
  // micro-batch's backward with clip coefficient 1 (the planned one under the previous-norm
  // rule), and whether that became the step's update (committed: the step's coefficient was
  // exactly that) or was discarded (other clipping, a skipped step).
  int speculated_entries = 0;
  bool speculation_committed = false;
  double speculation_seconds = 0;  // the speculation thread's update time, all entries
  // Every target of the step was ignored (loss masks): nothing ran, no update, loss 0.
  bool no_counted_targets = false;
  uint64_t skipped_total = 0;
  double step_seconds = 0;  // forward + backward of all micro-batches
  double tokens_per_second = 0;
  double previous_update_wait_seconds = 0;  // time spent waiting for last step's optimizer
  std::vector<LayerTiming> layers;          // per decoder layer (when collected)
  double total_stall_seconds = 0;           // exposed transfer of the step
  double total_copy_in_seconds = 0;
  uint64_t device_arena_peak_bytes = 0;
  // Bytes per memory tier right after the step.
  uint64_t device_arena_bytes = 0;   // allocated from the device arena
  uint64_t pinned_host_bytes = 0;    // pinned host memory (master, gradients, staging)
  uint64_t pageable_host_bytes = 0;  // pageable host memory (AdamW m and v)
  double optimizer_seconds = 0;      // the preceding AdamW update, all entries
  // NVMe tier traffic since the previous report (this step's gradient writes
  // and reads, the preceding optimizer pass's state and gradient traffic), and
  // the time the optimizer pass and the copy-out blocked on it.
  uint64_t nvme_bytes_read = 0;
  uint64_t nvme_bytes_written = 0;
  double nvme_wait_seconds = 0;
  // Data parallelism: time inside the step's collectives (counts, loss sums, gradients; waiting
  // for slower ranks included) and the payload bytes this rank sent.
  double communication_seconds = 0;
  uint64_t communication_bytes = 0;
  std::vector<ActivationBlockReport> activation_blocks;  // bottom-up, the top block last
  // One per device the step ran on, by device index (the metrics' rank); the
  // totals and per-layer figures above sum every device's timeline.
  std::vector<DeviceStepFigures> devices;
};

}  // namespace megatrain::engine
