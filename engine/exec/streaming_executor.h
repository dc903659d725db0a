// The streaming executor: runs one micro-batch's forward and backward on a
// device whose memory holds two layers' weights, streaming every parameter
// entry in from the host ParameterStore and every gradient back out.
//
// Event choreography (three streams: copy_in, compute, copy_out):
//  1. Weights of op j go to slot s_j (alternating; an op whose entries equal
//     the previous op's reuses its slot). copy_in waits slot_free[s_j]
//     (recorded by compute after the slot's previous user), waits on the host
//     for the entry's optimizer update of this step (UpdateGate), copies, and
//     records slot_ready[s_j]. So op j+1's copy-in overlaps op j's compute.
//  2. compute waits slot_ready[s_j] and, for gradient-producing ops,
//     grad_free[g] (the previous copy-out from gradient buffer g finished);
//     it zeroes the gradient buffer, runs the op, records slot_free[s_j]
//     and grad_ready[g].
//  3. copy_out waits grad_ready[g], copies the gradients into the host slab
//     (the first contribution of the step overwrites; later ones land in a
//     pinned staging buffer and are added in stream order, so the sum order
//     is fixed), and records grad_free[g].
//  4. Activation checkpoints that live on the host go out on copy_out after
//     the producing op (compute waits for that copy before overwriting the
//     buffer) and come back on copy_in before the block's recompute (copy_in
//     waits for the copy out first: it runs ahead of compute).
//  5. Offloaded activation sets (adaptive recomputation, step_schedule.h) go
//     out on copy_out after their forward (a later forward writing that
//     working set waits for the copy), and come back on copy_in once the last
//     earlier op using their working set has run (copy_in waits for that op
//     and for every offload), ahead of the block's backward, which waits for
//     the fetch.
// With options.serial every copy waits for the previous compute and every
// compute for the previous copies: the no-overlap baseline.
//
// Fragment mode (options.weight_ring_bytes > 0, engine/exec/fragment_plan.h):
// instead of step 1, each op's tensors are copied as row-block fragments, in
// the order the op consumes them, into a device ring; each copy waits for the
// free event of the earlier fragment whose bytes it overwrites (and for the
// entry's optimizer update), then records its own ready event. The op runs as
// parts (fragment_parts.h): compute waits only for the fragments of the next
// part, runs it, and records the free events of the fragments it has read for
// the last time. Copies are enqueued as early as their free events exist, so
// the next layer's first fragments go in while this layer computes. Results
// are bitwise those of whole-stage slots: the parts are the same math.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/device/device.h"
#include "engine/exec/activation_policy.h"
#include "engine/exec/activation_sets.h"
#include "engine/exec/cpu_layer_math.h"
#include "engine/exec/device_reduction.h"
#include "engine/exec/gradient_turns.h"
#include "engine/exec/model_dims.h"
#include "engine/exec/parameter_store.h"
#include "engine/exec/stage_backend.h"
#include "engine/exec/step_schedule.h"
#include "engine/exec/update_gate.h"

namespace megatrain::engine {

// Where each token of a micro-batch sits (packed SFT samples, sample_batches.h): host arrays of
// batch * seq entries, or null for the defaults (token t at position t % seq; one segment per
// sequence). Positions must lie in [0, seq); segment ids must be non-decreasing along each
// sequence (attention sees keys of the query's own segment only).
struct TokenLayout {
  const int32_t* positions = nullptr;
  const int32_t* segments = nullptr;
};

// ExecutorOptions::device_checkpoints: as many checkpoints on the device as fit its arena.
inline constexpr int kAutoDeviceCheckpoints = -1;

// Where a step's gradients are summed across its micro-batches
// (ExecutorOptions::gradient_accumulation).
enum class GradientAccumulation {
  // Every micro-batch's gradients go out; the host adds them into the slabs (or the NVMe
  // gradient file) in micro-batch order.
  kHost,
  // An fp32 sum per entry stays on the device: the first micro-batch copies into it, later ones
  // add, and only the step's last micro-batch copies the sums out. The sums are bit for bit the
  // host's (the same adds in the same order), so results never depend on it; it saves (A-1)/A of
  // the gradient copy-out and every host add. Costs 4 bytes of device memory per parameter of
  // the entries summed (all but a tied embedding, whose rows' gradient is scattered on the host).
  kDevice,
  // kDevice on a CUDA device when its sums fit the arena beside the minimum plan, else kHost.
  kAuto,
};
std::string_view GradientAccumulationName(GradientAccumulation g);
// "host", "device" or "auto"; anything else is INVALID_ARGUMENT naming the value.
absl::StatusOr<GradientAccumulation> ParseGradientAccumulation(std::string_view name);

// The rule of a run (the trainer's and the planner's): kAuto becomes kHost when a device runs
// one micro-batch a step (nothing to sum) or when several devices of one process share the
// store (their gradients meet on the host in micro-batch order); kDevice with several devices is
// INVALID_ARGUMENT naming the field. Otherwise `asked`, for the executor to resolve by device.
absl::StatusOr<GradientAccumulation> GradientAccumulationForRun(GradientAccumulation asked,
                                                                int micro_batches_per_device,
                                                                int devices_in_process);

// Per entry of a step schedule, whether GradientAccumulation::kDevice sums its gradient on the
// device: every entry a device op writes a gradient for, but one the host also contributes to
// (a tied embedding's rows, scattered on the host between the LM head's contributions: summing
// the head's part on the device would change the order of the adds).
std::vector<bool> DeviceSummedEntries(const std::vector<ScheduledOp>& schedule,
                                      size_t num_entries);

struct ExecutorOptions {
  int checkpoint_interval = 4;  // k: keep the input of every k-th layer
  bool keep_all = false;        // keep every activation, recompute nothing
  // How many activation checkpoints stay in device memory (the first ones);
  // the rest live in pinned host memory. kAutoDeviceCheckpoints (-1) = as many
  // as the arena holds beside the minimum plan (ChooseDeviceCheckpoints); n >= 0
  // = the first n (n >= the count = all). Never changes what is computed.
  int device_checkpoints = kAutoDeviceCheckpoints;
  bool serial = false;  // no overlap (baseline for benchmarks)
  // Micro-batches may carry segment ids (packed samples, TokenLayout): attention then reads them
  // (on CUDA our kernel, never cuDNN's). Off, a TokenLayout with segments is refused.
  bool segment_ids = false;
  // Device weight slots: 0 = as many as the arena holds beside the rest of the
  // plan (at least 2, at most one per stage, when every stage stays resident
  // and weights are copied once per optimizer step); otherwise exactly this
  // many (>= 2). Never changes what is computed.
  int weight_slots = 0;
  // Fragmented weight streaming: > 0 = device bytes of the weight ring that
  // replaces the slots (weight_slots is then unused); must hold the largest
  // tensor (often the LM head). 0 = whole-stage slots.
  size_t weight_ring_bytes = 0;
  // Largest row block of one fragment in bytes (fragment mode); 0 =
  // kDefaultFragmentBytes (fragment_plan.h). Never changes what is computed.
  size_t fragment_bytes = 0;
  // Device bytes for saved activation sets: 0 = the minimum (k working sets);
  // more lets blocks below the top keep their activations (k sets each).
  size_t activation_budget_bytes = 0;
  // How blocks that do not fit the budget get their activations back.
  ActivationPolicyKind activation_policy = ActivationPolicyKind::kRecompute;
  // Adaptive: re-decide when a measurement moves more than this from the one
  // the current decision used.
  double activation_drift_threshold = 0.15;
  // Tests and benchmarks: one mode per block (top block ignored), instead of
  // the policy's.
  std::vector<ActivationMode> block_modes;
  // Where a step's gradients are summed across its micro-batches. kDevice refuses several
  // executors on one store (MicroBatchTurns): their micro-batches interleave on the slabs.
  GradientAccumulation gradient_accumulation = GradientAccumulation::kHost;
  // Several devices of one process summing on their devices (needs kDevice): the reduce-scatter
  // every device's sums go through at its last micro-batch of a step, this executor being rank
  // `reduction_rank`. Each device then copies out only its shard of every summed entry, with no
  // turns; the sums are padded to a multiple of the world. Null: the host slabs take the
  // devices' contributions in turns (MicroBatchTurns).
  DeviceReduction* device_reduction = nullptr;
  int reduction_rank = 0;
  // With a device_reduction: every micro-batch's gradient of a summed entry is reduce-scattered
  // among the devices as it leaves the backward (into a shard buffer, on copy_out), and each
  // device keeps only the sum of its shard: 4/N bytes of device memory per summed parameter
  // instead of 4 (for models whose whole sums do not fit), for N times the peer traffic. Whole-
  // stage slots only (weight_ring_bytes = 0).
  bool reduce_every_micro_batch = false;
};

// Where the executor finds each stage's weights in the ParameterStore.
struct ExecutorLayout {
  ScheduleShape schedule;
  LayerOffsets layer_offsets;  // same for every layer
};

// Bytes of device memory the executor plans to allocate, by purpose.
struct DeviceMemoryPlan {
  size_t weight_slots = 0;  // the slots, or the ring in fragment mode
  bool weight_ring = false;
  size_t gradient_buffers = 0;
  size_t activations = 0;  // saved activation sets (the budget's, when set)
  size_t checkpoints = 0;  // device-resident activation checkpoints
  size_t scratch = 0;      // residual streams, backward scratch, head, attention, tokens
  // GradientAccumulation::kDevice: the step's fp32 sums (with reduce_every_micro_batch, this
  // device's shards and the shard buffer a reduce-scatter lands in)
  size_t gradient_sums = 0;
  int device_checkpoints = 0;  // how many checkpoints the `checkpoints` bytes hold
  int host_checkpoints = 0;    // the rest, in pinned host memory
  size_t total() const {
    return weight_slots + gradient_buffers + activations + checkpoints + scratch + gradient_sums;
  }
  std::string Describe() const;
};

struct MicroBatchResult {
  double loss_sum = 0.0;
  int64_t valid_tokens = 0;
};

class StreamingExecutor {
 public:
  // The plan with `weight_slots` slots (2 = the minimum the executor runs
  // with) for parameter entries of `entry_elements` padded floats each; the
  // options' checkpointing overrides the layout's. What Create allocates.
  // With options.weight_ring_bytes > 0 the weight line is the ring and
  // `weight_slots` is ignored. options.device_checkpoints must be resolved
  // (ChooseDeviceCheckpoints): here and in PinnedStagingBytes an unresolved
  // auto counts every checkpoint on the device.
  static DeviceMemoryPlan PlanDeviceMemory(const ModelDims& dims, const ExecutorLayout& layout,
                                           absl::Span<const size_t> entry_elements,
                                           const ExecutorOptions& options, int weight_slots = 2,
                                           DeviceKind kind = DeviceKind::kCpu);
  // Pinned host memory the executor allocates beside the store (host-resident
  // activation checkpoints, the gradient staging chunk and, when blocks may
  // offload, a host copy per layer below the top), in bytes requested.
  static size_t PinnedStagingBytes(const ModelDims& dims, const ExecutorLayout& layout,
                                   absl::Span<const size_t> entry_elements,
                                   const ExecutorOptions& options,
                                   DeviceKind kind = DeviceKind::kCpu);
  // The device checkpoint count Create uses: options.device_checkpoints
  // (clamped to the count), or with auto the most that fit an arena of
  // `arena_capacity` bytes beside the minimum plan (two weight slots or the
  // ring, gradient buffers, the activation sets of the budget, scratch and,
  // when some stay on the host, their staging buffer). Every checkpoint when
  // they all fit (the plan Create checked before auto existed); 0 when not even
  // the minimum plan fits (Create then fails naming the bytes). Checkpoints
  // come before extra weight slots: a host checkpoint costs a copy out and
  // back every micro-batch, an extra slot saves weight copies only once
  // every stage stays resident.
  static int ChooseDeviceCheckpoints(const ModelDims& dims, const ExecutorLayout& layout,
                                     absl::Span<const size_t> entry_elements,
                                     const ExecutorOptions& options, size_t arena_capacity,
                                     DeviceKind kind = DeviceKind::kCpu);
  // Floats of a weight slot holding these entries (packed at the executor's
  // alignment).
  static size_t StageFloats(absl::Span<const size_t> entry_elements,
                            const std::vector<int>& entries);
  // The slot count Create uses: options.weight_slots, or with 0 as many as
  // fit an arena of `arena_capacity` bytes beside the rest of the plan (its
  // device checkpoints chosen first, ChooseDeviceCheckpoints); 0 in fragment
  // mode (no slots).
  static int ChooseWeightSlots(const ModelDims& dims, const ExecutorLayout& layout,
                               absl::Span<const size_t> entry_elements,
                               const ExecutorOptions& options, size_t arena_capacity,
                               DeviceKind kind = DeviceKind::kCpu);
  // options.gradient_accumulation resolved for this arena and device: kAuto becomes kDevice on
  // CUDA when the sums fit beside the minimum plan (two slots or the ring, every checkpoint on
  // the host), else kHost; kHost and kDevice stay. PlanDeviceMemory and the Choose functions
  // count the sums for kDevice only (they resolve kAuto first).
  static GradientAccumulation ResolveGradientAccumulation(const ModelDims& dims,
                                                          const ExecutorLayout& layout,
                                                          absl::Span<const size_t> entry_elements,
                                                          const ExecutorOptions& options,
                                                          size_t arena_capacity,
                                                          DeviceKind kind = DeviceKind::kCpu);
  // Element sizes and device memory of the stage math of a kind of device.
  static StageSizes SizesFor(DeviceKind kind, const ModelDims& dims);

  // Allocates the plan from the device arena; a too-small arena fails with
  // RESOURCE_EXHAUSTED saying how many bytes the plan needs and for what.
  static absl::StatusOr<std::unique_ptr<StreamingExecutor>> Create(
      Device& device, const ModelDims& dims, const ExecutorLayout& layout, ParameterStore& store,
      UpdateGate& gate, const kernels::cpu::RopeTable& rope, const ExecutorOptions& options,
      ThreadPool* compute_pool = nullptr);

  ~StreamingExecutor();

  // Forward + backward of one micro-batch of dims.batch x dims.seq tokens.
  // Gradients are added into the store's slabs; `first_micro_batch` makes the
  // first contribution of each entry overwrite instead (a new step).
  // `weights_version` is the UpdateGate version the weights must have.
  // inv_total_valid = 1 / valid target tokens over all micro-batches of the step.
  // `turns`: with several executors on one store, each gradient copy-out takes
  // its turn (gradient_turns.h) so the slabs add up in micro-batch order.
  // `on_gradient_final` (optional): called with entry e by a host task on copy_out once e's last
  // gradient contribution of this micro-batch is in its host slab or NVMe file (after it in
  // stream order, and after its turn), so on the last micro-batch of a step a caller may read
  // e's final gradient while backward goes on (the trainer's speculative update). It must not
  // block.
  // `last_micro_batch`: with gradients summed on the device (GradientAccumulation::kDevice),
  // false keeps this micro-batch's sums on the device for a later one of the same step; true
  // (the default, always correct) copies the sums so far out, overwriting the slabs; then
  // on_gradient_final means the sums are out. A step whose first micro-batch said true goes on
  // on the host (its later micro-batches add into the slabs).
  absl::StatusOr<MicroBatchResult> RunMicroBatch(
      const int32_t* inputs, const int32_t* targets, float inv_total_valid,
      bool first_micro_batch, uint64_t weights_version, TokenLayout layout = {},
      MicroBatchTurns turns = {},
      const std::function<void(int entry)>& on_gradient_final = nullptr,
      bool last_micro_batch = true);

  // Forward only: the summed loss of one micro-batch (nothing is written to
  // the gradient slabs). Same weights_version rule as RunMicroBatch.
  absl::StatusOr<MicroBatchResult> EvaluateMicroBatch(const int32_t* inputs, const int32_t* targets,
                                                      uint64_t weights_version,
                                                      TokenLayout layout = {});

  // Forward only: logits [batch * seq, vocab] of one micro-batch, through a
  // temporary device buffer of that size (for tests and sampling).
  absl::StatusOr<std::vector<float>> ComputeLogits(const int32_t* inputs, uint64_t weights_version);

  // Forgets which weights the device slots hold: call after the host masters
  // change outside the optimizer (initialisation, loading, resume).
  void InvalidateWeights();

  // Ring bytes one layer's tensors take in fragment mode (each aligned):
  // the smallest ring holding a whole layer.
  static size_t LayerRingBytes(const ModelDims& dims, const LayerOffsets& offsets,
                               DeviceKind kind = DeviceKind::kCpu);

  const DeviceMemoryPlan& plan() const { return plan_; }
  // kHost or kDevice: where this executor sums a step's gradients (kAuto resolved at Create).
  GradientAccumulation gradient_accumulation() const;
  // With a device reduction: whether every micro-batch's gradients are reduce-scattered.
  bool reduces_every_micro_batch() const;
  // With a device reduction: whether entry e's gradient is reduce-scattered (summed on the
  // device), so that after a step its host slab holds only this device's shard
  // ([reduction_rank * shard, +shard), shard = ReductionShardElements). The others (the
  // embedding's rows, scattered on the host) hold this device's own sum.
  bool reduces_entry(int e) const;
  int weight_slots() const;  // 0 in fragment mode
  bool fragment_mode() const;
  // Fragment copies per RunMicroBatch (fragment mode; 0 otherwise).
  int step_fragment_count() const;
  const std::vector<ScheduledOp>& schedule() const { return schedule_; }
  // Bytes the training micro-batches moved over the host link for decoder
  // layers (weights in, gradients out, activation sets both ways) since the
  // last ObserveTimeline: a device's share of the step's link traffic.
  double layer_link_bytes() const;

  // Saved-activation sets Create allocates: k working sets plus k for each
  // block below the top that activation_budget_bytes can keep. A budget below
  // the k working sets is INVALID_ARGUMENT naming the minimum.
  static absl::StatusOr<int> ActivationSetsFor(const ModelDims& dims, const ExecutorLayout& layout,
                                               const ExecutorOptions& options,
                                               DeviceKind kind = DeviceKind::kCpu);
  // Adaptive recomputation: the per-block modes and reasons the next
  // micro-batches run with.
  const ActivationDecision& activation_decision() const;
  // Bytes of one saved-activation set of this executor's backend.
  size_t activation_set_bytes() const;
  // Measures link bandwidth and layer compute from the device timeline spans
  // of the micro-batches run since the last call (the timeline enabled while
  // they ran) and lets the policy re-decide; a changed decision rebuilds the
  // schedule (between steps). Returns whether the modes changed.
  bool ObserveTimeline(const std::vector<TimelineSpan>& spans);
  // Forces per-block modes (one per block, the top one ignored) from now on;
  // INVALID_ARGUMENT when more blocks keep than the budget allocated.
  absl::Status SetBlockModes(const std::vector<ActivationMode>& modes);

 private:
  struct Impl;
  explicit StreamingExecutor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  DeviceMemoryPlan plan_;
  std::vector<ScheduledOp> schedule_;
};

}  // namespace megatrain::engine
