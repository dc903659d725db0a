// StreamingExecutor::Impl: the executor's device buffers, streams, events
// and per-run state, shared by the files that run it (streaming_executor.cc:
// creation and one micro-batch's op loop; executor_stages.cc: each op's
// math and transfers; executor_fragments.cc: the weight ring;
// executor_activations.cc: activation modes). Private to engine/exec.
#pragma once

#include <memory>
#include <vector>

#include "engine/common/status_macros.h"
#include "engine/common/thread_pool.h"
#include "engine/exec/activation_measurement.h"
#include "engine/exec/fragment_plan.h"
#include "engine/exec/stage_backend.h"
#include "engine/exec/streaming_executor.h"
#include "engine/exec/streaming_executor_shapes.h"
#include "engine/exec/weight_slot_policy.h"

namespace megatrain::engine {

struct StreamingExecutor::Impl {
  Device& device;
  ModelDims dims;
  ExecutorLayout layout;
  ParameterStore& store;
  UpdateGate& gate;
  ExecutorOptions options;
  std::unique_ptr<StageBackend> backend;
  StageSizes sizes;
  std::vector<ScheduledOp> schedule;
  std::vector<size_t> entry_elements;  // padded floats of each store entry
  executor_internal::PlanShape shape;

  std::unique_ptr<Stream> copy_in, compute, copy_out;
  std::vector<std::unique_ptr<Event>> slot_ready, slot_free;
  std::unique_ptr<Event> grad_ready[2], grad_free[2];
  std::unique_ptr<Event> tokens_ready, x_ready, checkpoint_out_done, checkpoint_in_ready,
      checkpoint_stage_free, compute_done, copy_out_done, embedding_in_ready, embedding_grad_ready;

  std::vector<DeviceBuffer> slots;
  // Fragment mode: the ring, the plans of both schedules and one ready and
  // one free event per fragment (shared by the two plans: one Run at a time).
  DeviceBuffer ring;
  FragmentPlan step_fragments, eval_fragments;
  FragmentPlanInputs fragment_inputs;  // to re-plan when the activation modes change
  std::vector<std::unique_ptr<Event>> fragment_ready, fragment_free;
  size_t most_fragments = 0;  // of any activation modes: the all-recompute schedule's
  DeviceBuffer grads[2];
  std::unique_ptr<WeightSlotPolicy> slot_policy;
  std::vector<ScheduledOp> eval_schedule;
  std::vector<DeviceBuffer> activation_sets;
  DeviceBuffer x[2], dx[2];
  DeviceBuffer stage_scratch;  // the backend's workspaces
  DeviceBuffer ids, targets, positions, segments;
  // Host sources of the default token layout (t % seq; segment 0), copied when a micro-batch
  // brings none.
  std::vector<int32_t> default_positions, default_segments;
  std::vector<DeviceBuffer> device_checkpoints;
  DeviceBuffer checkpoint_stage;
  std::vector<PinnedHostBuffer> host_checkpoints;
  // Later gradient contributions of a step land here chunk by chunk, alternating between two
  // buffers of gradient_staging_floats, and are added into the host slab by host_pool while the
  // next chunk's copy lands in the other buffer (bounded pinned memory). The adds of each
  // buffer are waited for (on copy_out, in stream order) before the buffer is written again and
  // before the entry's contribution counts as landed.
  PinnedHostBuffer gradient_staging;
  size_t gradient_staging_floats = 0;
  // Host threads for the copy-out stream's memory-bound work (the adds above, the rows'
  // gradient reset): persistent, so a 4 MB add does not pay for starting threads.
  std::unique_ptr<ThreadPool> host_pool;
  TaskHandle staged_adds[2];  // per staging buffer, its add in flight (used on copy_out only)
  // The embedding stages' pinned rows: the batch's gathered rows going in,
  // their gradients coming out (activation_bytes()).
  PinnedHostBuffer embedding_rows;
  std::vector<int32_t> host_ids;      // the micro-batch's token ids, for the host embedding
  std::vector<int32_t> host_targets;  // and its targets, for backends that count on the host

  float* logits_output = nullptr;  // device buffer; when set, the eval head writes logits

  // Several devices on one store (gradient_turns.h): the turns of the
  // micro-batch being run (none outside RunMicroBatch), and per entry how many
  // contributions one micro-batch makes and how many this one has enqueued.
  MicroBatchTurns turns;
  std::vector<uint64_t> contributions_per_micro_batch, contributions_enqueued;
  // GradientAccumulation::kDevice: per entry its fp32 sum on the device (empty for the entries
  // DeviceSummedEntries leaves to the host), and the place of the micro-batch being run in its
  // step: whether it sums on the device at all (a step of one micro-batch copies straight out),
  // starts the sums, and copies them out.
  std::vector<DeviceBuffer> gradient_sums;
  DeviceBuffer reduce_scratch;  // reduce_every_micro_batch: where a later micro-batch's shard lands
  bool sums_on_device = false;
  bool sums_start = false;
  bool sums_go_out = true;
  bool sums_pending = false;  // the step's sums are on the device, not yet copied out
  bool SummedOnDevice(int e) const {
    return sums_on_device && gradient_sums[static_cast<size_t>(e)].data() != nullptr;
  }

  // Adaptive recomputation: the block modes the schedule was built with, the
  // policy choosing them (null when forced), and per working set the events
  // of its offload copy (written, out), of its fetch (gate, in).
  ActivationDecision activation_decision;
  std::unique_ptr<ActivationPolicy> activation_policy;
  int working_sets = 0;
  int keep_capacity_blocks = 0;
  std::vector<std::unique_ptr<Event>> set_written, set_out_done, set_fetch_gate, set_in_ready;
  std::unique_ptr<Event> offloads_done;
  std::vector<PinnedHostBuffer> offloaded_sets;  // per layer, allocated when first offloaded
  LayerTraffic traffic;                          // since the last ObserveTimeline

  Impl(Device& d, const ModelDims& m, const ExecutorLayout& l, ParameterStore& s, UpdateGate& g,
       const ExecutorOptions& o, std::unique_ptr<StageBackend> b)
      : device(d),
        dims(m),
        layout(l),
        store(s),
        gate(g),
        options(o),
        backend(std::move(b)),
        sizes(backend->sizes()) {}

  size_t activation_bytes() const { return executor_internal::ActivationBytes(dims, sizes); }
  // On CUDA the wait for an optimizer update must stay on the enqueueing
  // thread, whatever runs the host tasks: a copy-in host task that waits for
  // the update holds its stream in a device-side wait, and the update needs
  // copy-out's gradients, which may sit behind it in the same hardware queue
  // (or, on the driver's callback thread, behind the task itself): a deadlock.
  // Waiting here still leaves the already enqueued earlier stages running.
  // The CPU device waits inside its copy stream, so enqueueing never blocks.
  bool WaitForUpdatesOnHost() const { return device.kind() == DeviceKind::kCuda; }
  void* SlotPointer(int slot, size_t element_offset) const {
    return slots[slot].data_as<char>() + element_offset * sizes.weight_element_bytes;
  }
  bool fragment_mode() const { return options.weight_ring_bytes > 0; }
  // Where an activation checkpoint is read from in backward.
  void* CheckpointPointer(int c) const;

  // The plan's device buffers (a failure names the first that did not fit).
  absl::Status Allocate(int num_slots);
  // The pinned host buffers: host checkpoints, the gradient staging, the embedding rows.
  absl::Status AllocatePinnedStaging();
  absl::StatusOr<MicroBatchResult> Run(const std::vector<ScheduledOp>& ops, const int32_t* inputs,
                                       const int32_t* targets, float inv_total_valid,
                                       bool first_micro_batch, uint64_t weights_version,
                                       TokenLayout layout = {},
                                       const std::function<void(int)>& on_gradient_final = nullptr,
                                       bool last_micro_batch = true);
  bool CheckpointOnHost(int c) const { return c >= shape.device_checkpoints; }
  // Run's steps (streaming_executor.cc). Checks the ids and targets against
  // the vocabulary, the layout against seq, and copies them in.
  absl::Status UploadTokens(const int32_t* inputs, const int32_t* targets, TokenLayout layout);
  // copy_in: a host checkpoint back into the staging buffer for a recompute.
  void EnqueueCheckpointIn(const ScheduledOp& op);
  // copy_in: an op's entries into whole-layer slot `slot`, after their updates.
  void EnqueueSlotCopy(const ScheduledOp& op, const std::vector<size_t>& offsets, int slot,
                       uint64_t weights_version, bool training);
  // The first forward's checkpoint of its input (device copy, or out to the
  // host; `pending_checkpoint_wait` tracks a host copy still reading x).
  void EnqueueCheckpointSave(const ScheduledOp& op, const void* x_in,
                             bool& pending_checkpoint_wait);
  // copy_out: a whole-slot op's gradients from buffer `grad` into RAM or NVMe (or first into
  // their device sums, on compute).
  absl::Status EnqueueStageGradientsOut(const ScheduledOp& op, const std::vector<size_t>& offsets,
                                        int grad, std::vector<bool>& contributed, bool training);
  // compute, before the gradient buffer's ready event: for an entry summed on the device, the
  // `count` floats at `src` (its elements from `first`) into its sum: copied on the step's first
  // micro-batch, added after. Nothing for other entries.
  absl::Status EnqueueDeviceSum(int e, const float* src, size_t first, size_t count,
                                const TimelineTag& tag);
  // copy_out, after that event: the contribution at `src` to the host (EnqueueGradientCopyOut);
  // for an entry summed on the device, its sum instead, overwriting, on the step's last
  // micro-batch only. Returns the bytes it sends.
  // With a DeviceReduction, at the entry's last part: the reduce-scatter of its whole sum, then
  // this device's shard out (EnqueueReducedShardOut).
  absl::StatusOr<size_t> EnqueueContributionOut(int e, const float* src, size_t first,
                                                size_t count, bool overwrite,
                                                const TimelineTag& tag);
  absl::StatusOr<size_t> EnqueueReducedShardOut(int e, const TimelineTag& tag);
  // reduce_every_micro_batch: this micro-batch's gradient of entry e (at src in the gradient
  // buffer) reduce-scattered into the device's shard sum, which the last micro-batch copies out.
  absl::StatusOr<size_t> EnqueueShardReduction(int e, const float* src, const TimelineTag& tag);
  // This device's shard of entry e (its reduced sums at shard_sums) into the host slab; bytes.
  size_t EnqueueOwnShardOut(int e, const float* shard_sums, size_t shard, const TimelineTag& tag);
  bool ReducesEveryMicroBatch() const {
    return options.device_reduction != nullptr && options.reduce_every_micro_batch;
  }
  int ReductionWorld() const {
    return options.device_reduction != nullptr ? options.device_reduction->world() : 1;
  }
  // Zeroes once what a reduce-scatter reads but nobody copies out: the sums' padding
  // (DeviceSumFloats), or the gradient buffers with reduce_every_micro_batch.
  absl::Status ZeroSumPadding();
  void EnqueueEmbeddingForward(const ScheduledOp& op, void* x_out, uint64_t weights_version);
  void EnqueueEmbeddingBackward(const ScheduledOp& op, const void* dx_out, bool first_contribution);
  // With the store's rows' gradient kept apart (a tied embedding on a data-parallel rank): fills it
  // with -0.0 on copy_out, before the step's first scatter. Nothing otherwise.
  void EnqueueRowsGradientReset();
  absl::Status EnqueueOp(const ScheduledOp& op, const std::vector<size_t>& offsets, int slot,
                         int grad, const void* x_in, void* x_out, const void* dx_out, void* dx_in,
                         float inv_total_valid);
  // The head in the form the op asks for (logits, loss, or forward + backward).
  absl::Status EnqueueHead(const ScheduledOp& op, HeadArgs args, void* dx_in,
                           float inv_total_valid, const TimelineTag& tag);
  // copy_out: `count` gradient floats of entry e from element `first`, at
  // `src` on the device, stored into the entry's gradient (the step's first
  // contribution) or added to it, in RAM or on NVMe.
  void EnqueueGradientCopyOut(int e, const float* src, size_t first, size_t count, bool overwrite,
                              const TimelineTag& tag);
  // EnqueueGradientCopyOut without the turns.
  void EnqueueGradientRanges(int e, const float* src, size_t first, size_t count, bool overwrite,
                             const TimelineTag& tag);
  // Counts each entry's contributions in `ops` and starts this micro-batch's turns.
  void BeginTurns(const std::vector<ScheduledOp>& ops, MicroBatchTurns micro_batch_turns);
  // copy_out: waits until every earlier contribution to entry e has landed
  // (no-op without turns); TurnLanded then says this one has.
  void EnqueueTurnWait(int e, int layer);
  void EnqueueTurnLanded(int e, int layer);

  // Fragment mode. Copies run in plan order; `next_copy` is the first fragment
  // not yet enqueued and `parts_enqueued` the parts whose frees are recorded.
  struct FragmentCursor {
    const std::vector<ScheduledOp>* ops = nullptr;
    const FragmentPlan* plan = nullptr;
    int next_copy = 0;
    uint64_t weights_version = 0;
  };
  void EnqueueFragmentCopy(FragmentCursor& cursor);
  // Enqueues every copy whose blocker is freed by a part < parts_enqueued.
  void EnqueueCopiesAhead(FragmentCursor& cursor, int parts_enqueued);
  // A training head also copies out each part's gradient (a vocabulary
  // block's, the final norm's) through the two gradient buffers, starting
  // with buffer `grad` and leaving it at the next free one; `contributed`
  // says which entries this step's gradients already reached.
  absl::Status EnqueueFragmentedOp(const ScheduledOp& op, int op_index, FragmentCursor& cursor,
                                   int& grad, std::vector<bool>& contributed, const void* x_in,
                                   void* x_out, const void* dx_out, void* dx_in,
                                   float inv_total_valid);

  absl::Status SetUpActivationPolicy();
  ActivationCosts ActivationCostsOf() const;
  // Rebuilds the schedule for `decision`, allocating host copies for newly
  // offloaded layers.
  absl::Status ApplyActivationDecision(const ActivationDecision& decision);
  // copy_in: the fetches whose sets the ops before were done with.
  void EnqueueFetches(std::vector<ActivationFetch>& pending);
  // compute, before the op: the offload copy of the set it overwrites, the
  // fetch of the set it reads.
  void WaitForActivationSets(const ScheduledOp& op, std::vector<bool>& offload_pending);
  // After the op: its set's offload copy, the gates of the fetches it allows.
  void AfterActivationOp(const ScheduledOp& op, std::vector<bool>& offload_pending,
                         std::vector<ActivationFetch>& pending);
};

}  // namespace megatrain::engine
