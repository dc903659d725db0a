// StreamingExecutor implementation (protocol in streaming_executor.h).
#include "engine/exec/streaming_executor.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/exec/activation_measurement.h"
#include "engine/exec/cuda_stage_backend.h"
#include "engine/exec/fragment_plan.h"
#include "engine/exec/host_embedding.h"
#include "engine/exec/nvme_gradient_offload.h"
#include "engine/exec/nvme_weight_copy.h"
#include "engine/exec/weight_slot_policy.h"

namespace megatrain::engine {
namespace {

constexpr size_t kEntryAlignFloats = 64;
// Chunk of later gradient contributions staged on the host (4 MiB).
constexpr size_t kGradientStagingFloats = size_t{1} << 20;

size_t GradientStagingBytes(size_t grad_floats) {
  return std::min(grad_floats, kGradientStagingFloats) * sizeof(float) + 64;
}

// One [tokens, hidden] activation tensor of the backend (residual stream,
// checkpoint, embedding rows).
size_t ActivationBytes(const ModelDims& dims, const StageSizes& sizes) {
  return static_cast<size_t>(dims.tokens() * dims.hidden) * sizes.activation_element_bytes;
}

size_t AlignFloats(size_t n) {
  return (n + kEntryAlignFloats - 1) / kEntryAlignFloats * kEntryAlignFloats;
}
size_t Round256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Float offsets of each of an op's entries when packed into one slot.
std::vector<size_t> StageOffsets(absl::Span<const size_t> entry_elements,
                                 const std::vector<int>& entries, size_t* total_floats) {
  std::vector<size_t> offsets;
  size_t used = 0;
  for (int e : entries) {
    offsets.push_back(used);
    used += AlignFloats(entry_elements[e]);
  }
  *total_floats = used;
  return offsets;
}

std::vector<size_t> EntryElements(const ParameterStore& store) {
  std::vector<size_t> elements;
  for (int e = 0; e < store.num_entries(); ++e) elements.push_back(store.spec(e).elements);
  return elements;
}

// The layout's schedule with the options' checkpointing applied.
ExecutorLayout WithOptions(ExecutorLayout layout, const ExecutorOptions& options) {
  layout.schedule.checkpoint_interval = options.checkpoint_interval;
  layout.schedule.keep_all = options.keep_all;
  layout.schedule.block_modes = options.block_modes;
  return layout;
}

struct PlanShape {
  size_t slot_floats = 0;
  size_t grad_floats = 0;
  int activation_sets = 0;
  int checkpoints = 0;
  int device_checkpoints = 0;
};

// Floats of the gradient buffer an op writes. A fragmented head writes one
// vocabulary block's or the final norm's gradient at a time.
size_t GradientFloats(const ModelDims& dims, absl::Span<const size_t> entry_elements,
                      const ExecutorOptions& options, const ScheduledOp& op) {
  if (options.weight_ring_bytes > 0 && op.kind == StageKind::kHead) {
    return std::max(AlignFloats(static_cast<size_t>(HeadBlockRows(dims) * dims.hidden)),
                    AlignFloats(entry_elements[op.entries[0]]));
  }
  size_t floats = 0;
  StageOffsets(entry_elements, op.entries, &floats);
  return floats;
}

PlanShape ShapePlan(const ModelDims& dims, const ExecutorLayout& layout,
                    absl::Span<const size_t> entry_elements, const ExecutorOptions& options,
                    const std::vector<ScheduledOp>& schedule) {
  PlanShape p;
  for (const ScheduledOp& op : schedule) {
    size_t floats = 0;
    StageOffsets(entry_elements, op.entries, &floats);
    p.slot_floats = std::max(p.slot_floats, floats);
    if (op.produces_gradients) {
      p.grad_floats = std::max(p.grad_floats, GradientFloats(dims, entry_elements, options, op));
    }
  }
  p.activation_sets = ActivationSetCount(layout.schedule);
  p.checkpoints = CheckpointCount(layout.schedule);
  p.device_checkpoints = options.device_checkpoints < 0
                             ? p.checkpoints
                             : std::min(options.device_checkpoints, p.checkpoints);
  return p;
}

// The decision of modes set by hand (options.block_modes, SetBlockModes).
ActivationDecision ForcedDecision(const ScheduleShape& shape) {
  ActivationDecision decision;
  const int k = shape.keep_all ? shape.num_layers : shape.checkpoint_interval;
  for (int b = 0; b < BlockCount(shape); ++b) {
    BlockDecision block;
    block.first_layer = b * k;
    block.num_layers = std::min(k, shape.num_layers - b * k);
    block.mode = BlockMode(shape, b);
    block.reason = absl::StrCat(ActivationModeName(block.mode), ": forced");
    decision.blocks.push_back(std::move(block));
  }
  return decision;
}

}  // namespace

std::string DeviceMemoryPlan::Describe() const {
  return absl::StrFormat(
      "%d bytes = %s %d + gradient buffers %d + saved activations %d + "
      "checkpoints %d + scratch %d",
      total(), weight_ring ? "weight ring" : "weight slots", weight_slots, gradient_buffers,
      activations, checkpoints, scratch);
}

DeviceMemoryPlan StreamingExecutor::PlanDeviceMemory(const ModelDims& dims,
                                                     const ExecutorLayout& given_layout,
                                                     absl::Span<const size_t> entry_elements,
                                                     const ExecutorOptions& options,
                                                     int weight_slots, DeviceKind kind) {
  const ExecutorLayout layout = WithOptions(given_layout, options);
  const auto schedule = BuildStepSchedule(layout.schedule);
  const PlanShape p = ShapePlan(dims, layout, entry_elements, options, schedule);
  const StageSizes sizes = SizesFor(kind, dims);
  const size_t n = static_cast<size_t>(dims.tokens());
  const size_t x_bytes = Round256(ActivationBytes(dims, sizes));
  DeviceMemoryPlan plan;
  if (options.weight_ring_bytes > 0) {
    plan.weight_ring = true;
    plan.weight_slots = Round256(options.weight_ring_bytes);
  } else {
    plan.weight_slots = weight_slots * Round256(p.slot_floats * sizes.weight_element_bytes);
  }
  plan.gradient_buffers = 2 * Round256(p.grad_floats * sizeof(float));
  const absl::StatusOr<int> sets = ActivationSetsFor(dims, given_layout, options, kind);
  plan.activations = (sets.ok() ? *sets : p.activation_sets) * Round256(sizes.activation_set_bytes);
  plan.checkpoints = p.device_checkpoints * x_bytes;
  plan.scratch = 4 * x_bytes + Round256(sizes.scratch_bytes) + 3 * Round256(n * sizeof(int32_t));
  if (p.device_checkpoints < p.checkpoints) plan.scratch += x_bytes;  // staging for host ones
  return plan;
}

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
  PlanShape shape;

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
  DeviceBuffer grads[2];
  std::unique_ptr<WeightSlotPolicy> slot_policy;
  std::vector<ScheduledOp> eval_schedule;
  std::vector<DeviceBuffer> activation_sets;
  DeviceBuffer x[2], dx[2];
  DeviceBuffer stage_scratch;  // the backend's workspaces
  DeviceBuffer ids, targets, positions;
  std::vector<DeviceBuffer> device_checkpoints;
  DeviceBuffer checkpoint_stage;
  std::vector<PinnedHostBuffer> host_checkpoints;
  // Later gradient contributions of a step land here chunk by chunk and are
  // added into the host slab in copy_out stream order (bounded pinned memory).
  PinnedHostBuffer gradient_staging;
  // The embedding stages' pinned rows: the batch's gathered rows going in,
  // their gradients coming out (activation_bytes()).
  PinnedHostBuffer embedding_rows;
  std::vector<int32_t> host_ids;      // the micro-batch's token ids, for the host embedding
  std::vector<int32_t> host_targets;  // and its targets, for backends that count on the host

  float* logits_output = nullptr;  // device buffer; when set, the eval head writes logits

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

  size_t activation_bytes() const { return ActivationBytes(dims, sizes); }
  // A CUDA stream runs host tasks on the driver's callback thread, which must
  // not block for an optimizer update (it would hold up every stream's host
  // work): there the enqueueing thread waits for the update instead, which
  // still leaves the already enqueued earlier stages running. The CPU device
  // waits inside its copy stream, so enqueueing never blocks.
  bool WaitForUpdatesOnHost() const { return device.kind() == DeviceKind::kCuda; }
  void* SlotPointer(int slot, size_t element_offset) const {
    return slots[slot].data_as<char>() + element_offset * sizes.weight_element_bytes;
  }
  bool fragment_mode() const { return options.weight_ring_bytes > 0; }
  // Where an activation checkpoint is read from in backward.
  void* CheckpointPointer(int c) const;

  absl::Status Allocate(int num_slots);
  absl::StatusOr<MicroBatchResult> Run(const std::vector<ScheduledOp>& ops, const int32_t* inputs,
                                       const int32_t* targets, float inv_total_valid,
                                       bool first_micro_batch, uint64_t weights_version);
  bool CheckpointOnHost(int c) const { return c >= shape.device_checkpoints; }
  void EnqueueEmbeddingForward(const ScheduledOp& op, void* x_out, uint64_t weights_version);
  void EnqueueEmbeddingBackward(const ScheduledOp& op, const void* dx_out, bool first_contribution);
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

absl::Status StreamingExecutor::Impl::Allocate(int num_slots) {
  absl::Status first_error;
  auto alloc = [&](size_t bytes, std::string_view tag) -> DeviceBuffer {
    if (!first_error.ok()) return DeviceBuffer();
    absl::StatusOr<DeviceBuffer> b = device.Allocate(bytes, tag);
    if (!b.ok()) {
      first_error = b.status();
      return DeviceBuffer();
    }
    return std::move(*b);
  };
  const size_t n = static_cast<size_t>(dims.tokens());
  const size_t x_bytes = activation_bytes();
  for (int i = 0; i < num_slots; ++i) {
    slots.push_back(alloc(shape.slot_floats * sizes.weight_element_bytes, "weight slot"));
  }
  if (fragment_mode()) ring = alloc(options.weight_ring_bytes, "weight ring");
  for (int i = 0; i < 2; ++i)
    grads[i] = alloc(shape.grad_floats * sizeof(float), "gradient buffer");
  for (int i = 0; i < shape.activation_sets; ++i) {
    activation_sets.push_back(alloc(sizes.activation_set_bytes, "saved activations"));
  }
  for (int c = 0; c < shape.device_checkpoints; ++c) {
    device_checkpoints.push_back(alloc(x_bytes, "activation checkpoint"));
  }
  for (int i = 0; i < 2; ++i) {
    x[i] = alloc(x_bytes, "residual stream");
    dx[i] = alloc(x_bytes, "residual gradient");
  }
  stage_scratch = alloc(sizes.scratch_bytes, "stage scratch");
  ids = alloc(n * sizeof(int32_t), "token ids");
  targets = alloc(n * sizeof(int32_t), "targets");
  positions = alloc(n * sizeof(int32_t), "positions");
  if (shape.device_checkpoints < shape.checkpoints) {
    checkpoint_stage = alloc(x_bytes, "checkpoint staging");
  }
  if (!first_error.ok()) return first_error;

  for (int c = shape.device_checkpoints; c < shape.checkpoints; ++c) {
    absl::StatusOr<PinnedHostBuffer> b = device.AllocatePinned(x_bytes);
    if (!b.ok()) return b.status();
    host_checkpoints.push_back(std::move(*b));
  }
  {
    absl::StatusOr<PinnedHostBuffer> b =
        device.AllocatePinned(GradientStagingBytes(shape.grad_floats));
    if (!b.ok()) return b.status();
    gradient_staging = std::move(*b);
  }
  {
    absl::StatusOr<PinnedHostBuffer> b = device.AllocatePinned(x_bytes);
    if (!b.ok()) return b.status();
    embedding_rows = std::move(*b);
  }
  return absl::OkStatus();
}

void* StreamingExecutor::Impl::CheckpointPointer(int c) const {
  return CheckpointOnHost(c) ? checkpoint_stage.data() : device_checkpoints[c].data();
}

StageSizes StreamingExecutor::SizesFor(DeviceKind kind, const ModelDims& dims) {
  return kind == DeviceKind::kCuda ? CudaStageSizes(dims) : CpuStageSizes(dims);
}

absl::StatusOr<std::unique_ptr<StreamingExecutor>> StreamingExecutor::Create(
    Device& device, const ModelDims& dims, const ExecutorLayout& layout, ParameterStore& store,
    UpdateGate& gate, const kernels::cpu::RopeTable& rope, const ExecutorOptions& options,
    ThreadPool* compute_pool) {
  if (options.checkpoint_interval < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint_interval=", options.checkpoint_interval, " must be >= 1"));
  }
  if (dims.head_chunk < 1) {
    return absl::InvalidArgumentError(absl::StrCat("head_chunk=", dims.head_chunk));
  }
  if (options.weight_slots == 1 || options.weight_slots < 0) {
    return absl::InvalidArgumentError(absl::StrCat("weight_slots=", options.weight_slots,
                                                   " must be 0 (auto) or >= 2 (double buffering)"));
  }
  std::unique_ptr<StageBackend> backend;
  if (device.kind() == DeviceKind::kCuda) {
    absl::StatusOr<std::unique_ptr<StageBackend>> cuda =
        MakeCudaStageBackend(device, dims, layout.layer_offsets, rope);
    if (!cuda.ok()) return cuda.status();
    backend = std::move(*cuda);
  } else {
    backend = MakeCpuStageBackend(dims, layout.layer_offsets, rope, compute_pool);
  }
  auto impl = std::make_unique<Impl>(device, dims, WithOptions(layout, options), store, gate,
                                     options, std::move(backend));
  impl->entry_elements = EntryElements(store);
  impl->schedule = BuildStepSchedule(impl->layout.schedule);
  impl->eval_schedule = BuildEvalSchedule(impl->layout.schedule);
  impl->shape = ShapePlan(dims, impl->layout, impl->entry_elements, options, impl->schedule);
  if (impl->fragment_mode()) {
    FragmentPlanInputs& in = impl->fragment_inputs;
    in.dims = dims;
    in.offsets = layout.layer_offsets;
    in.entry_elements = impl->entry_elements;
    in.element_bytes = impl->sizes.weight_element_bytes;
    in.ring_bytes = options.weight_ring_bytes;
    in.fragment_bytes = options.fragment_bytes > 0 ? options.fragment_bytes : kDefaultFragmentBytes;
    absl::StatusOr<FragmentPlan> step = PlanFragments(impl->schedule, in);
    if (!step.ok()) return step.status();
    absl::StatusOr<FragmentPlan> eval = PlanFragments(impl->eval_schedule, in);
    if (!eval.ok()) return eval.status();
    impl->step_fragments = std::move(*step);
    impl->eval_fragments = std::move(*eval);
  }
  {
    absl::StatusOr<int> sets = ActivationSetsFor(dims, layout, options, device.kind());
    if (!sets.ok()) return sets.status();
    impl->shape.activation_sets = *sets;
  }
  const int num_slots = ChooseWeightSlots(dims, layout, impl->entry_elements, options,
                                          device.arena_stats().capacity, device.kind());
  const DeviceMemoryPlan plan =
      PlanDeviceMemory(dims, layout, impl->entry_elements, options, num_slots, device.kind());

  if (absl::Status s = impl->Allocate(num_slots); !s.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("device memory too small for the streaming plan: it needs ", plan.Describe(),
                     " (arena capacity ", device.arena_stats().capacity,
                     " bytes); allocation failed: ", s.message()));
  }
  for (auto* stream : {&impl->copy_in, &impl->compute, &impl->copy_out}) {
    const char* name = stream == &impl->copy_in   ? "copy_in"
                       : stream == &impl->compute ? "compute"
                                                  : "copy_out";
    absl::StatusOr<std::unique_ptr<Stream>> s = device.CreateStream(name);
    if (!s.ok()) return s.status();
    *stream = std::move(*s);
  }
  std::vector<std::unique_ptr<Event>*> events = {
      &impl->tokens_ready,          &impl->x_ready,
      &impl->checkpoint_out_done,   &impl->checkpoint_in_ready,
      &impl->checkpoint_stage_free, &impl->compute_done,
      &impl->copy_out_done,         &impl->embedding_in_ready,
      &impl->embedding_grad_ready};
  impl->slot_ready.resize(num_slots);
  impl->slot_free.resize(num_slots);
  for (int i = 0; i < num_slots; ++i) {
    events.push_back(&impl->slot_ready[i]);
    events.push_back(&impl->slot_free[i]);
  }
  const size_t fragment_events =
      std::max(impl->step_fragments.fragments.size(), impl->eval_fragments.fragments.size());
  impl->fragment_ready.resize(fragment_events);
  impl->fragment_free.resize(fragment_events);
  for (size_t i = 0; i < fragment_events; ++i) {
    events.push_back(&impl->fragment_ready[i]);
    events.push_back(&impl->fragment_free[i]);
  }
  impl->slot_policy = std::make_unique<WeightSlotPolicy>(num_slots);
  for (int i = 0; i < 2; ++i) {
    events.push_back(&impl->grad_ready[i]);
    events.push_back(&impl->grad_free[i]);
  }
  for (auto* e : events) {
    absl::StatusOr<std::unique_ptr<Event>> created = device.CreateEvent();
    if (!created.ok()) return created.status();
    *e = std::move(*created);
  }
  {
    std::vector<void*> sets;
    for (const DeviceBuffer& b : impl->activation_sets) sets.push_back(b.data());
    if (absl::Status s = impl->backend->Bind(impl->stage_scratch.data(), sets,
                                             impl->positions.data_as<int32_t>(), *impl->copy_in);
        !s.ok()) {
      return s;
    }
  }
  // Positions are the same for every micro-batch: copy them once.
  std::vector<int32_t> pos(static_cast<size_t>(dims.tokens()));
  for (size_t t = 0; t < pos.size(); ++t) pos[t] = static_cast<int32_t>(t % dims.seq);
  impl->copy_in->CopyHostToDevice(impl->positions.data(), pos.data(), pos.size() * sizeof(int32_t));
  if (absl::Status s = impl->copy_in->Synchronize(); !s.ok()) return s;
  if (absl::Status s = impl->SetUpActivationPolicy(); !s.ok()) return s;

  auto executor = std::unique_ptr<StreamingExecutor>(new StreamingExecutor(std::move(impl)));
  executor->plan_ = plan;
  executor->schedule_ = executor->impl_->schedule;
  return executor;
}

StreamingExecutor::StreamingExecutor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StreamingExecutor::~StreamingExecutor() {
  if (impl_) {
    // Drain the streams before the buffers their queued work points into go away.
    for (auto* s : {impl_->copy_in.get(), impl_->compute.get(), impl_->copy_out.get()}) {
      if (s != nullptr) s->Synchronize().IgnoreError();
    }
  }
}

absl::Status StreamingExecutor::Impl::EnqueueOp(const ScheduledOp& op,
                                                const std::vector<size_t>& offsets, int slot,
                                                int grad, const void* x_in, void* x_out,
                                                const void* dx_out, void* dx_in,
                                                float inv_total_valid) {
  const void* w = slots[slot].data();
  float* g = grads[grad].data_as<float>();
  size_t grad_floats = 0;
  if (op.produces_gradients) StageOffsets(entry_elements, op.entries, &grad_floats);
  const TimelineTag tag{SpanKind::kCompute, DescribeOp(op), op.layer};
  switch (op.kind) {
    case StageKind::kLayerForward:
      // A forward that saves nothing writes its intermediates into set 0: no
      // saved set is live before the top block's forward or during evaluation.
      return backend->LayerForward(*compute, w, x_in, op.save_activations ? op.activation_set : 0,
                                   x_out, tag);
    case StageKind::kLayerBackward:
      return backend->LayerBackward(*compute, w, op.activation_set, dx_out, dx_in, g, grad_floats,
                                    tag);
    case StageKind::kHead: {
      HeadArgs args;
      args.final_norm = SlotPointer(slot, offsets[0]);
      args.lm_head = SlotPointer(slot, offsets[1]);
      args.x_final = x_in;
      if (op.produces_gradients) {
        args.final_norm_grad = g + offsets[0];
        args.lm_head_grad = g + offsets[1];
      }
      return EnqueueHead(op, args, dx_in, inv_total_valid, tag);
    }
    case StageKind::kEmbedForward:
    case StageKind::kEmbedBackward:
      break;  // host stages: EnqueueEmbeddingForward / EnqueueEmbeddingBackward
  }
  return absl::OkStatus();
}

absl::Status StreamingExecutor::Impl::EnqueueHead(const ScheduledOp& op, HeadArgs args,
                                                  void* dx_in, float inv_total_valid,
                                                  const TimelineTag& tag) {
  args.targets = targets.data_as<int32_t>();
  args.host_targets = host_targets.data();
  if (op.loss_only && logits_output != nullptr) {
    args.logits = logits_output;
    return backend->HeadLogits(*compute, args, tag);
  }
  if (op.loss_only) return backend->HeadLoss(*compute, args, tag);
  args.inv_total_valid = inv_total_valid;
  args.dx_final = dx_in;
  return backend->HeadForwardBackward(*compute, args, tag);
}

void StreamingExecutor::Impl::EnqueueGradientCopyOut(int e, const float* src, size_t first,
                                                     size_t count, bool overwrite,
                                                     const TimelineTag& tag) {
  if (store.grad_on_nvme(e)) {
    EnqueueNvmeGradientOffload(*copy_out, *store.nvme_gradients(), e, src, first, count, overwrite,
                               gradient_staging.data_as<float>(),
                               std::min(count, kGradientStagingFloats), tag);
    return;
  }
  float* slab = store.entry(e).grad + first;
  if (overwrite) {
    copy_out->CopyDeviceToHost(slab, src, count * sizeof(float), tag);
    return;
  }
  float* staged = gradient_staging.data_as<float>();
  for (size_t done = 0; done < count; done += kGradientStagingFloats) {
    const size_t n = std::min(kGradientStagingFloats, count - done);
    copy_out->CopyDeviceToHost(staged, src + done, n * sizeof(float), tag);
    copy_out->EnqueueHostTask(
        [staged, slab = slab + done, n] {
          for (size_t j = 0; j < n; ++j) slab[j] += staged[j];
        },
        {SpanKind::kCopyOut, "accumulate gradients", tag.layer});
  }
}

void StreamingExecutor::Impl::EnqueueFragmentCopy(FragmentCursor& cursor) {
  const FragmentPlan& plan = *cursor.plan;
  const WeightFragment& f = plan.fragments[cursor.next_copy];
  const PlannedTensor& t = plan.tensors[f.tensor];
  const ScheduledOp& op = (*cursor.ops)[t.op];
  if (options.serial) copy_in->WaitEvent(*compute_done, {SpanKind::kWait, "serial", op.layer});
  if (f.blocker >= 0) {
    copy_in->WaitEvent(*fragment_free[f.blocker], {SpanKind::kWait, "ring free", op.layer});
  }
  const bool from_nvme = store.compute_on_nvme(t.entry);
  if (f.waits_for_update) {
    const int e = t.entry;
    const uint64_t version = cursor.weights_version;
    // From NVMe the chunk is read by this thread: the update must be published first.
    if (WaitForUpdatesOnHost() || from_nvme) {
      gate.WaitFor(e, version);
    } else {
      UpdateGate* update_gate = &gate;
      copy_in->EnqueueHostTask([update_gate, e, version] { update_gate->WaitFor(e, version); },
                               {SpanKind::kWait, "optimizer update", op.layer});
    }
  }
  const size_t eb = sizes.weight_element_bytes;
  if (from_nvme) {
    absl::Status s = EnqueueNvmeWeightCopy(
        *copy_in, *store.nvme_compute_copy(), t.entry, static_cast<size_t>(f.element_offset),
        static_cast<size_t>(f.elements), ring.data_as<char>() + f.ring_offset,
        {SpanKind::kCopyIn, DescribeOp(op), op.layer});
    // The stream's sticky error fails the micro-batch (what is queued drains).
    if (!s.ok()) copy_in->EnqueueFallibleHostTask([s] { return s; });
  } else {
    const char* source = static_cast<const char*>(backend->WeightSource(store.entry(t.entry)));
    copy_in->CopyHostToDevice(
        ring.data_as<char>() + f.ring_offset, source + static_cast<size_t>(f.element_offset) * eb,
        static_cast<size_t>(f.elements) * eb, {SpanKind::kCopyIn, DescribeOp(op), op.layer});
  }
  // The activation policy's bandwidth measure counts the layers' weight bytes
  // (the copy spans it times are the layer ops').
  if (cursor.plan == &step_fragments && op.layer >= 0) {
    traffic.copy_in_bytes += static_cast<double>(static_cast<size_t>(f.elements) * eb);
  }
  copy_in->RecordEvent(*fragment_ready[cursor.next_copy]);
  ++cursor.next_copy;
}

void StreamingExecutor::Impl::EnqueueCopiesAhead(FragmentCursor& cursor, int parts_enqueued) {
  const FragmentPlan& plan = *cursor.plan;
  while (cursor.next_copy < static_cast<int>(plan.fragments.size())) {
    const WeightFragment& f = plan.fragments[cursor.next_copy];
    if (f.blocker >= 0 && plan.fragments[f.blocker].last_reader >= parts_enqueued) return;
    // Where the enqueueing thread itself waits for updates, running ahead into
    // an entry not updated yet would hold back this op's remaining parts.
    const int entry = plan.tensors[f.tensor].entry;
    if ((WaitForUpdatesOnHost() || store.compute_on_nvme(entry)) && f.waits_for_update &&
        gate.version(entry) < cursor.weights_version) {
      return;
    }
    EnqueueFragmentCopy(cursor);
  }
}

absl::Status StreamingExecutor::Impl::EnqueueFragmentedOp(
    const ScheduledOp& op, int op_index, FragmentCursor& cursor, int& grad,
    std::vector<bool>& contributed, const void* x_in, void* x_out, const void* dx_out, void* dx_in,
    float inv_total_valid) {
  const FragmentPlan& plan = *cursor.plan;
  const std::vector<size_t>& ring_offsets = plan.ring_offsets[op_index];
  char* base = ring.data_as<char>();
  auto at = [&](size_t i) -> const void* {
    return ring_offsets[i] == SIZE_MAX ? nullptr : base + ring_offsets[i];
  };
  const bool head = op.kind == StageKind::kHead;
  LayerWeightPointers w;
  if (!head) {
    for (int i = 0; i < kLayerTensorCount; ++i) w[LayerTensorAt(i)] = at(static_cast<size_t>(i));
  }
  size_t grad_floats = 0;
  if (op.produces_gradients && !head) StageOffsets(entry_elements, op.entries, &grad_floats);
  const TimelineTag tag{SpanKind::kCompute, DescribeOp(op), op.layer};
  for (int p = 0; p < plan.part_count[op_index]; ++p) {
    const int global_part = plan.first_part[op_index] + p;
    const PlannedPart& part = plan.parts[global_part];
    while (cursor.next_copy <= part.last_fragment) EnqueueFragmentCopy(cursor);
    compute->WaitEvent(*fragment_ready[part.last_fragment], {SpanKind::kWait, "weights", op.layer});
    absl::Status launched;
    // A training head's part that writes a gradient, and the gradient's place.
    int grad_entry = -1;
    size_t grad_first = 0, grad_count = 0;
    switch (op.kind) {
      case StageKind::kLayerForward:
        launched = backend->LayerForwardPart(
            *compute, p, w, x_in, op.save_activations ? op.activation_set : 0, x_out, tag);
        break;
      case StageKind::kLayerBackward:
        launched = backend->LayerBackwardPart(*compute, p, w, op.activation_set, dx_out, dx_in,
                                              grads[grad].data_as<float>(), grad_floats, tag);
        break;
      case StageKind::kHead: {
        const HeadStep step = HeadStepAt(dims, p);
        const bool norm_step =
            step.kind == HeadStepKind::kNorm || step.kind == HeadStepKind::kNormBackward;
        // Part p reads unit p: the final norm or the rows of the step's block.
        HeadArgs args;
        args.final_norm = norm_step ? at(static_cast<size_t>(p)) : nullptr;
        args.lm_head = norm_step ? nullptr : at(static_cast<size_t>(p));
        args.x_final = x_in;
        args.part = p;
        if (op.produces_gradients && step.kind == HeadStepKind::kBackwardBlock) {
          const HeadBlock block = HeadBlockAt(dims, step.block);
          grad_entry = op.entries[1];
          grad_first = static_cast<size_t>(block.first_row * dims.hidden);
          grad_count = static_cast<size_t>(block.rows * dims.hidden);
          args.lm_head_grad = grads[grad].data_as<float>();
        } else if (op.produces_gradients && step.kind == HeadStepKind::kNormBackward) {
          grad_entry = op.entries[0];
          grad_count = store.spec(grad_entry).elements;
          args.final_norm_grad = grads[grad].data_as<float>();
        }
        if (grad_entry >= 0) {
          compute->WaitEvent(*grad_free[grad], {SpanKind::kWait, "gradient buffer", op.layer});
        }
        launched = EnqueueHead(op, args, dx_in, inv_total_valid, tag);
        break;
      }
      case StageKind::kEmbedForward:
      case StageKind::kEmbedBackward:
        break;  // host stages have no parts
    }
    if (!launched.ok()) return launched;
    for (int f : part.frees) compute->RecordEvent(*fragment_free[f]);
    compute->RecordEvent(*compute_done);
    if (grad_entry >= 0) {
      // The part's gradient goes out while the next part computes into the other buffer.
      compute->RecordEvent(*grad_ready[grad]);
      copy_out->WaitEvent(*grad_ready[grad], {SpanKind::kWait, "gradients ready", op.layer});
      EnqueueGradientCopyOut(grad_entry, grads[grad].data_as<float>(), grad_first, grad_count,
                             !contributed[grad_entry],
                             {SpanKind::kCopyOut, DescribeOp(op), op.layer});
      copy_out->RecordEvent(*grad_free[grad]);
      copy_out->RecordEvent(*copy_out_done);
      grad ^= 1;
      // The LM head's blocks all belong to this step's first contribution.
      if (HeadStepAt(dims, p).kind == HeadStepKind::kNormBackward) {
        contributed[op.entries[0]] = true;
        contributed[op.entries[1]] = true;
      }
    }
    if (!options.serial) EnqueueCopiesAhead(cursor, global_part + 1);
  }
  return absl::OkStatus();
}

void StreamingExecutor::Impl::EnqueueEmbeddingForward(const ScheduledOp& op, void* x_out,
                                                      uint64_t weights_version) {
  const int e = op.host_entry;
  void* rows = embedding_rows.data();
  const EntryBuffers table = store.entry(e);
  if (WaitForUpdatesOnHost()) {
    gate.WaitFor(e, weights_version);
    backend->GatherEmbeddingRows(table, host_ids.data(), rows);
  } else {
    UpdateGate* update_gate = &gate;
    copy_in->EnqueueHostTask(
        [update_gate, e, weights_version] { update_gate->WaitFor(e, weights_version); },
        {SpanKind::kWait, "optimizer update", -1});
    Impl* self = this;
    copy_in->EnqueueHostTask(
        [self, table, rows] {
          self->backend->GatherEmbeddingRows(table, self->host_ids.data(), rows);
        },
        {SpanKind::kCopyIn, "embed.gather", -1});
  }
  copy_in->CopyHostToDevice(x_out, rows, activation_bytes(),
                            {SpanKind::kCopyIn, DescribeOp(op), -1});
  copy_in->RecordEvent(*embedding_in_ready);
  compute->WaitEvent(*embedding_in_ready, {SpanKind::kWait, "embedding rows", -1});
}

void StreamingExecutor::Impl::EnqueueEmbeddingBackward(const ScheduledOp& op, const void* dx_out,
                                                       bool first_contribution) {
  const int e = op.host_entry;
  void* rows = embedding_rows.data();
  float* slab = store.entry(e).grad;
  compute->RecordEvent(*embedding_grad_ready);
  copy_out->WaitEvent(*embedding_grad_ready, {SpanKind::kWait, "gradients ready", -1});
  copy_out->CopyDeviceToHost(rows, dx_out, activation_bytes(),
                             {SpanKind::kCopyOut, DescribeOp(op), -1});
  Impl* self = this;
  copy_out->EnqueueHostTask(
      [self, rows, slab, first_contribution] {
        self->backend->ScatterEmbeddingGradients(rows, self->host_ids.data(), first_contribution,
                                                 slab);
      },
      {SpanKind::kCopyOut, "embed.scatter", -1});
  copy_out->RecordEvent(*copy_out_done);
}

size_t StreamingExecutor::PinnedStagingBytes(const ModelDims& dims,
                                             const ExecutorLayout& given_layout,
                                             absl::Span<const size_t> entry_elements,
                                             const ExecutorOptions& options, DeviceKind kind) {
  const ExecutorLayout layout = WithOptions(given_layout, options);
  const PlanShape p =
      ShapePlan(dims, layout, entry_elements, options, BuildStepSchedule(layout.schedule));
  const size_t x_bytes = ActivationBytes(dims, SizesFor(kind, dims));
  // Host checkpoints, the gradient staging chunk, the embedding rows and
  // what the backend downloads (the CUDA heads' per-chunk losses).
  const size_t backend_bytes = kind == DeviceKind::kCuda ? CudaStageBackendPinnedBytes(dims) : 0;
  // Offloaded activation sets: at most every layer below the top block, when
  // the policy (or the forced modes) may offload.
  size_t offload_bytes = 0;
  const bool may_offload = options.block_modes.empty()
                               ? options.activation_policy != ActivationPolicyKind::kRecompute
                               : BlocksWithMode(layout.schedule, ActivationMode::kOffload) > 0;
  if (may_offload && !layout.schedule.keep_all) {
    const int k = layout.schedule.checkpoint_interval;
    const int below_top = (layout.schedule.num_layers - 1) / k * k;
    offload_bytes = static_cast<size_t>(below_top) * SizesFor(kind, dims).activation_set_bytes;
  }
  return static_cast<size_t>(p.checkpoints - p.device_checkpoints) * x_bytes +
         GradientStagingBytes(p.grad_floats) + x_bytes + backend_bytes + offload_bytes;
}

size_t StreamingExecutor::StageFloats(absl::Span<const size_t> entry_elements,
                                      const std::vector<int>& entries) {
  size_t floats = 0;
  StageOffsets(entry_elements, entries, &floats);
  return floats;
}

int StreamingExecutor::ChooseWeightSlots(const ModelDims& dims, const ExecutorLayout& given_layout,
                                         absl::Span<const size_t> entry_elements,
                                         const ExecutorOptions& options, size_t arena_capacity,
                                         DeviceKind kind) {
  if (options.weight_ring_bytes > 0) return 0;
  if (options.weight_slots > 0) return options.weight_slots;
  const ExecutorLayout layout = WithOptions(given_layout, options);
  const std::vector<ScheduledOp> schedule = BuildStepSchedule(layout.schedule);
  std::vector<std::vector<int>> stages;
  for (const ScheduledOp& op : schedule) {
    if (!op.entries.empty()) stages.push_back(op.entries);
  }
  const int max_slots = std::max(2, DistinctStageCount(stages));
  const PlanShape shape = ShapePlan(dims, layout, entry_elements, options, schedule);
  const size_t base = PlanDeviceMemory(dims, layout, entry_elements, options, 2, kind).total();
  const size_t slot_bytes = Round256(shape.slot_floats * SizesFor(kind, dims).weight_element_bytes);
  const size_t spare = arena_capacity > base ? arena_capacity - base : 0;
  // Leave 1/16 of the arena for allocator fragmentation.
  const size_t usable = spare > arena_capacity / 16 ? spare - arena_capacity / 16 : 0;
  return std::min<int>(max_slots, 2 + static_cast<int>(usable / std::max<size_t>(slot_bytes, 1)));
}

int StreamingExecutor::weight_slots() const { return impl_->slot_policy->num_slots(); }

bool StreamingExecutor::fragment_mode() const { return impl_->fragment_mode(); }

int StreamingExecutor::step_fragment_count() const {
  return static_cast<int>(impl_->step_fragments.fragments.size());
}

size_t StreamingExecutor::LayerRingBytes(const ModelDims& dims, const LayerOffsets& offsets,
                                         DeviceKind kind) {
  return engine::LayerRingBytes(dims, offsets, SizesFor(kind, dims).weight_element_bytes);
}

void StreamingExecutor::InvalidateWeights() {
  impl_->slot_policy = std::make_unique<WeightSlotPolicy>(impl_->slot_policy->num_slots());
}

absl::StatusOr<MicroBatchResult> StreamingExecutor::RunMicroBatch(const int32_t* inputs,
                                                                  const int32_t* targets,
                                                                  float inv_total_valid,
                                                                  bool first_micro_batch,
                                                                  uint64_t weights_version) {
  return impl_->Run(impl_->schedule, inputs, targets, inv_total_valid, first_micro_batch,
                    weights_version);
}

absl::StatusOr<MicroBatchResult> StreamingExecutor::EvaluateMicroBatch(const int32_t* inputs,
                                                                       const int32_t* targets,
                                                                       uint64_t weights_version) {
  return impl_->Run(impl_->eval_schedule, inputs, targets, 0.0f, false, weights_version);
}

absl::StatusOr<std::vector<float>> StreamingExecutor::ComputeLogits(const int32_t* inputs,
                                                                    uint64_t weights_version) {
  Impl& s = *impl_;
  const size_t count = static_cast<size_t>(s.dims.tokens() * s.dims.vocab);
  absl::StatusOr<DeviceBuffer> logits = s.device.Allocate(count * sizeof(float), "logits");
  if (!logits.ok()) return logits.status();
  const std::vector<int32_t> no_targets(static_cast<size_t>(s.dims.tokens()), -1);
  s.logits_output = logits->data_as<float>();
  absl::StatusOr<MicroBatchResult> run =
      s.Run(s.eval_schedule, inputs, no_targets.data(), 0.0f, false, weights_version);
  s.logits_output = nullptr;
  if (!run.ok()) return run.status();
  std::vector<float> host(count);
  s.copy_out->CopyDeviceToHost(host.data(), logits->data(), count * sizeof(float),
                               {SpanKind::kCopyOut, "logits", -1});
  if (absl::Status status = s.copy_out->Synchronize(); !status.ok()) return status;
  return host;
}

absl::StatusOr<MicroBatchResult> StreamingExecutor::Impl::Run(
    const std::vector<ScheduledOp>& ops, const int32_t* inputs, const int32_t* targets,
    float inv_total_valid, bool first_micro_batch, uint64_t weights_version) {
  Impl& s = *this;
  if (absl::Status h = s.device.health(); !h.ok()) return h;
  const ModelDims& m = s.dims;
  const size_t n = static_cast<size_t>(m.tokens());
  for (size_t t = 0; t < n; ++t) {
    if (inputs[t] < 0 || inputs[t] >= m.vocab) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", inputs[t], " at position ", t,
                                                     " is outside the vocabulary [0, ", m.vocab,
                                                     ")"));
    }
    if (targets[t] >= m.vocab) {
      return absl::InvalidArgumentError(absl::StrCat("target id ", targets[t], " at position ", t,
                                                     " is outside the vocabulary [0, ", m.vocab,
                                                     ")"));
    }
  }
  s.host_ids.assign(inputs, inputs + n);
  s.host_targets.assign(targets, targets + n);
  s.copy_in->CopyHostToDevice(s.ids.data(), inputs, n * sizeof(int32_t),
                              {SpanKind::kCopyIn, "token ids", -1});
  s.copy_in->CopyHostToDevice(s.targets.data(), targets, n * sizeof(int32_t),
                              {SpanKind::kCopyIn, "targets", -1});
  s.copy_in->RecordEvent(*s.tokens_ready);
  s.compute->WaitEvent(*s.tokens_ready, {SpanKind::kWait, "tokens", -1});

  std::vector<bool> contributed(static_cast<size_t>(s.store.num_entries()), !first_micro_batch);
  int grad = 0;
  int xi = 0;   // residual stream buffer holding the current activations
  int dxi = 0;  // residual gradient buffer holding the current gradient
  bool pending_checkpoint_wait = false;
  absl::Status launch_status;
  FragmentCursor fragments;
  if (s.fragment_mode()) {
    fragments.ops = &ops;
    fragments.plan = &ops == &s.schedule ? &s.step_fragments : &s.eval_fragments;
    fragments.weights_version = weights_version;
  }
  const bool training = &ops == &s.schedule;
  std::vector<bool> offload_pending(static_cast<size_t>(s.working_sets), false);
  std::vector<ActivationFetch> pending_fetches;

  for (const ScheduledOp& op : ops) {
    const int op_index = static_cast<int>(&op - ops.data());
    if (op.kind == StageKind::kEmbedForward) {
      s.EnqueueEmbeddingForward(op, s.x[xi].data(), weights_version);
      continue;
    }
    if (op.kind == StageKind::kEmbedBackward) {
      const int e = op.host_entry;
      s.EnqueueEmbeddingBackward(op, s.dx[dxi].data(), !contributed[e]);
      contributed[e] = true;
      continue;
    }
    size_t stage_floats = 0;
    const std::vector<size_t> offsets = StageOffsets(s.entry_elements, op.entries, &stage_floats);
    const bool host_checkpoint_in = op.kind == StageKind::kLayerForward && op.recompute &&
                                    op.checkpoint >= 0 && s.CheckpointOnHost(op.checkpoint);
    if (host_checkpoint_in) {
      // The checkpoint's copy to the host (copy_out, forward) must have
      // landed before it is read back; copy_in runs ahead of compute, so
      // compute's own wait does not order it. The last forward copy covers
      // every earlier one (one stream).
      s.copy_in->WaitEvent(*s.checkpoint_out_done, {SpanKind::kWait, "checkpoint out", op.layer});
      s.copy_in->WaitEvent(*s.checkpoint_stage_free,
                           {SpanKind::kWait, "checkpoint stage", op.layer});
      s.copy_in->CopyHostToDevice(
          s.checkpoint_stage.data(),
          s.host_checkpoints[op.checkpoint - s.shape.device_checkpoints].data(),
          s.activation_bytes(), {SpanKind::kCopyIn, "checkpoint", op.layer});
      s.copy_in->RecordEvent(*s.checkpoint_in_ready);
    }
    // Fragment mode copies weights part by part in EnqueueFragmentedOp.
    const WeightSlotPolicy::Decision placed =
        s.fragment_mode() ? WeightSlotPolicy::Decision{-1, false}
                          : s.slot_policy->Place(op.entries, weights_version);
    const int slot = placed.slot;
    if (placed.copy) {
      if (s.options.serial)
        s.copy_in->WaitEvent(*s.compute_done, {SpanKind::kWait, "serial", op.layer});
      s.copy_in->WaitEvent(*s.slot_free[slot], {SpanKind::kWait, "slot free", op.layer});
      for (size_t i = 0; i < op.entries.size(); ++i) {
        const int e = op.entries[i];
        const bool from_nvme = s.store.compute_on_nvme(e);
        // From NVMe the chunks are read by this thread: the update must be published first.
        if (s.WaitForUpdatesOnHost() || from_nvme) {
          s.gate.WaitFor(e, weights_version);
        } else {
          UpdateGate* gate = &s.gate;
          s.copy_in->EnqueueHostTask(
              [gate, e, weights_version] { gate->WaitFor(e, weights_version); },
              {SpanKind::kWait, "optimizer update", op.layer});
        }
        if (from_nvme) {
          absl::Status copied = EnqueueNvmeWeightCopy(
              *s.copy_in, *s.store.nvme_compute_copy(), e, 0, s.store.spec(e).elements,
              s.SlotPointer(slot, offsets[i]), {SpanKind::kCopyIn, DescribeOp(op), op.layer});
          if (!copied.ok()) s.copy_in->EnqueueFallibleHostTask([copied] { return copied; });
        } else {
          s.copy_in->CopyHostToDevice(s.SlotPointer(slot, offsets[i]),
                                      s.backend->WeightSource(s.store.entry(e)),
                                      s.store.spec(e).elements * s.sizes.weight_element_bytes,
                                      {SpanKind::kCopyIn, DescribeOp(op), op.layer});
        }
        if (training && op.layer >= 0) {
          s.traffic.copy_in_bytes +=
              static_cast<double>(s.store.spec(e).elements * s.sizes.weight_element_bytes);
        }
      }
      s.copy_in->RecordEvent(*s.slot_ready[slot]);
    }
    s.EnqueueFetches(pending_fetches);

    // Pointers of the residual stream for this op.
    const void* x_in = nullptr;
    void* x_out = nullptr;
    const void* dx_out = nullptr;
    void* dx_in = nullptr;
    switch (op.kind) {
      case StageKind::kEmbedForward:
      case StageKind::kEmbedBackward:
        break;  // handled above
      case StageKind::kLayerForward:
        x_in = (op.recompute && op.checkpoint >= 0) ? s.CheckpointPointer(op.checkpoint)
                                                    : s.x[xi].data();
        x_out = s.x[xi ^ 1].data();
        break;
      case StageKind::kHead:
        x_in = s.x[xi].data();
        dx_in = s.dx[dxi].data();
        break;
      case StageKind::kLayerBackward:
        dx_out = s.dx[dxi].data();
        dx_in = s.dx[dxi ^ 1].data();
        break;
    }

    // Save the input of every k-th layer as a checkpoint in the first forward.
    const bool saves_checkpoint =
        op.kind == StageKind::kLayerForward && !op.recompute && op.checkpoint >= 0;
    if (saves_checkpoint && !s.CheckpointOnHost(op.checkpoint)) {
      s.compute->CopyDeviceToDevice(s.device_checkpoints[op.checkpoint].data(), x_in,
                                    s.activation_bytes(),
                                    {SpanKind::kCompute, "checkpoint", op.layer});
    } else if (saves_checkpoint) {
      if (pending_checkpoint_wait) {
        s.compute->WaitEvent(*s.checkpoint_out_done, {SpanKind::kWait, "checkpoint out", op.layer});
        pending_checkpoint_wait = false;
      }
      s.compute->RecordEvent(*s.x_ready);
      s.copy_out->WaitEvent(*s.x_ready, {SpanKind::kWait, "checkpoint ready", op.layer});
      s.copy_out->CopyDeviceToHost(
          s.host_checkpoints[op.checkpoint - s.shape.device_checkpoints].data(), x_in,
          s.activation_bytes(), {SpanKind::kCopyOut, "checkpoint", op.layer});
      s.copy_out->RecordEvent(*s.checkpoint_out_done);
    } else if (pending_checkpoint_wait && op.kind == StageKind::kLayerForward) {
      // This op overwrites the buffer the checkpoint copy is reading.
      s.compute->WaitEvent(*s.checkpoint_out_done, {SpanKind::kWait, "checkpoint out", op.layer});
      pending_checkpoint_wait = false;
    }
    if (saves_checkpoint && s.CheckpointOnHost(op.checkpoint)) pending_checkpoint_wait = true;

    if (!s.fragment_mode()) {
      s.compute->WaitEvent(*s.slot_ready[slot], {SpanKind::kWait, "weights", op.layer});
    }
    s.WaitForActivationSets(op, offload_pending);
    if (host_checkpoint_in) {
      s.compute->WaitEvent(*s.checkpoint_in_ready, {SpanKind::kWait, "checkpoint in", op.layer});
    }
    // A fragmented head waits for and copies out its gradients part by part.
    const bool gradients_by_part = s.fragment_mode() && op.kind == StageKind::kHead;
    if (op.produces_gradients && !gradients_by_part) {
      s.compute->WaitEvent(*s.grad_free[grad], {SpanKind::kWait, "gradient buffer", op.layer});
    }
    if (s.options.serial)
      s.compute->WaitEvent(*s.copy_out_done, {SpanKind::kWait, "serial", op.layer});
    if (s.fragment_mode()) {
      launch_status = s.EnqueueFragmentedOp(op, op_index, fragments, grad, contributed, x_in,
                                            x_out, dx_out, dx_in, inv_total_valid);
      if (!launch_status.ok()) break;  // what is queued still drains below
    } else {
      launch_status =
          s.EnqueueOp(op, offsets, slot, grad, x_in, x_out, dx_out, dx_in, inv_total_valid);
      if (!launch_status.ok()) break;  // what is queued still drains below
      s.compute->RecordEvent(*s.slot_free[slot]);
      s.compute->RecordEvent(*s.compute_done);
    }
    if (host_checkpoint_in) s.compute->RecordEvent(*s.checkpoint_stage_free);
    s.AfterActivationOp(op, offload_pending, pending_fetches);
    if (training && op.kind == StageKind::kLayerForward) ++s.traffic.forward_ops;
    if (training && op.kind == StageKind::kLayerBackward) ++s.traffic.backward_ops;

    if (op.produces_gradients && !gradients_by_part) {
      s.compute->RecordEvent(*s.grad_ready[grad]);
      s.copy_out->WaitEvent(*s.grad_ready[grad], {SpanKind::kWait, "gradients ready", op.layer});
      for (size_t i = 0; i < op.entries.size(); ++i) {
        const int e = op.entries[i];
        const size_t count = s.store.spec(e).elements;
        if (training && op.layer >= 0) {
          s.traffic.copy_out_bytes += static_cast<double>(count * sizeof(float));
        }
        s.EnqueueGradientCopyOut(e, s.grads[grad].data_as<float>() + offsets[i], 0, count,
                                 !contributed[e], {SpanKind::kCopyOut, DescribeOp(op), op.layer});
        contributed[e] = true;
      }
      s.copy_out->RecordEvent(*s.grad_free[grad]);
      s.copy_out->RecordEvent(*s.copy_out_done);
      grad ^= 1;
    }

    // Advance the residual streams.
    if (op.kind == StageKind::kLayerForward) xi ^= 1;
    if (op.kind == StageKind::kLayerBackward) dxi ^= 1;
  }

  s.EnqueueFetches(pending_fetches);  // none left when the schedule is whole
  absl::Status status = launch_status;
  for (Stream* stream : {s.copy_in.get(), s.compute.get(), s.copy_out.get()}) {
    status.Update(stream->Synchronize());
  }
  if (!status.ok()) return status;
  const HeadResultSum head = s.backend->head_result();
  return MicroBatchResult{head.loss_sum, head.valid_tokens};
}

absl::StatusOr<int> StreamingExecutor::ActivationSetsFor(const ModelDims& dims,
                                                         const ExecutorLayout& given_layout,
                                                         const ExecutorOptions& options,
                                                         DeviceKind kind) {
  const ExecutorLayout layout = WithOptions(given_layout, options);
  ScheduleShape base = layout.schedule;
  base.block_modes.clear();
  const int working = ActivationSetCount(base);
  const int forced = ActivationSetCount(layout.schedule);
  const size_t set_bytes = Round256(SizesFor(kind, dims).activation_set_bytes);
  const size_t budget = options.activation_budget_bytes;
  if (budget == 0) return forced;
  if (budget < static_cast<size_t>(working) * set_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("activation_budget_bytes=", budget, " is below the minimum of ",
                     static_cast<size_t>(working) * set_bytes, " bytes (", working,
                     " working activation sets of ", set_bytes, " bytes)"));
  }
  if (base.keep_all) return working;
  const int k = base.checkpoint_interval;
  const int keepable =
      std::min(BlockCount(base) - 1, static_cast<int>(budget / set_bytes - working) / k);
  return std::max(working + k * keepable, forced);
}

ActivationCosts StreamingExecutor::Impl::ActivationCostsOf() const {
  ActivationCosts c;
  c.num_layers = layout.schedule.num_layers;
  c.checkpoint_interval = layout.schedule.checkpoint_interval;
  c.keep_capacity_blocks = keep_capacity_blocks;
  if (c.num_layers > 0) {
    const size_t elements = store.spec(layout.schedule.first_layer_entry).elements;
    c.weight_bytes = static_cast<double>(elements * sizes.weight_element_bytes);
    c.gradient_bytes = static_cast<double>(elements * sizeof(float));
  }
  c.activation_set_bytes = static_cast<double>(sizes.activation_set_bytes);
  return c;
}

absl::Status StreamingExecutor::Impl::SetUpActivationPolicy() {
  ScheduleShape base = layout.schedule;
  base.block_modes.clear();
  working_sets = ActivationSetCount(base);
  const int k = base.checkpoint_interval;
  keep_capacity_blocks = base.keep_all ? 0 : (shape.activation_sets - working_sets) / k;
  std::vector<std::unique_ptr<Event>*> events;
  for (auto* list : {&set_written, &set_out_done, &set_fetch_gate, &set_in_ready}) {
    list->resize(static_cast<size_t>(working_sets));
    for (auto& e : *list) events.push_back(&e);
  }
  events.push_back(&offloads_done);
  for (auto* e : events) {
    absl::StatusOr<std::unique_ptr<Event>> created = device.CreateEvent();
    if (!created.ok()) return created.status();
    *e = std::move(*created);
  }
  ActivationDecision decision;
  if (options.block_modes.empty()) {
    activation_policy = std::make_unique<ActivationPolicy>(
        options.activation_policy, ActivationCostsOf(), options.activation_drift_threshold);
    decision = activation_policy->decision();
  } else {
    decision = ForcedDecision(layout.schedule);
  }
  return ApplyActivationDecision(decision);
}

absl::Status StreamingExecutor::Impl::ApplyActivationDecision(const ActivationDecision& decision) {
  ScheduleShape next = layout.schedule;
  next.block_modes = decision.modes();
  if (BlocksWithMode(next, ActivationMode::kKeep) > keep_capacity_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block_modes keep ", BlocksWithMode(next, ActivationMode::kKeep),
        " blocks below the top but the activation budget holds ", keep_capacity_blocks));
  }
  std::vector<ScheduledOp> ops = BuildStepSchedule(next);
  FragmentPlan fragments;
  if (fragment_mode()) {
    // Kept and offloaded blocks drop recompute ops, so the plan never needs
    // more fragments (and events) than the all-recompute one Create sized.
    absl::StatusOr<FragmentPlan> planned = PlanFragments(ops, fragment_inputs);
    if (!planned.ok()) return planned.status();
    if (planned->fragments.size() > fragment_ready.size()) {
      return absl::InternalError(absl::StrCat("activation modes need ", planned->fragments.size(),
                                              " weight fragments; ", fragment_ready.size(),
                                              " events were created"));
    }
    fragments = std::move(*planned);
  }
  offloaded_sets.resize(static_cast<size_t>(next.num_layers));
  for (const ScheduledOp& op : ops) {
    if (!op.offload_activations || offloaded_sets[op.layer].data() != nullptr) continue;
    absl::StatusOr<PinnedHostBuffer> b = device.AllocatePinned(sizes.activation_set_bytes);
    if (!b.ok()) return b.status();
    offloaded_sets[op.layer] = std::move(*b);
  }
  layout.schedule = next;
  schedule = std::move(ops);
  if (fragment_mode()) step_fragments = std::move(fragments);
  activation_decision = decision;
  return absl::OkStatus();
}

void StreamingExecutor::Impl::EnqueueFetches(std::vector<ActivationFetch>& pending) {
  for (const ActivationFetch& f : pending) {
    copy_in->WaitEvent(*set_fetch_gate[f.set], {SpanKind::kWait, "activation set free", f.layer});
    copy_in->WaitEvent(*offloads_done, {SpanKind::kWait, "activations out", f.layer});
    copy_in->CopyHostToDevice(activation_sets[f.set].data(), offloaded_sets[f.layer].data(),
                              sizes.activation_set_bytes,
                              {SpanKind::kCopyIn, std::string(kFetchLabel), f.layer});
    copy_in->RecordEvent(*set_in_ready[f.set]);
    traffic.copy_in_bytes += static_cast<double>(sizes.activation_set_bytes);
  }
  pending.clear();
}

void StreamingExecutor::Impl::WaitForActivationSets(const ScheduledOp& op,
                                                    std::vector<bool>& offload_pending) {
  if (op.kind == StageKind::kLayerForward) {
    const size_t set = static_cast<size_t>(op.save_activations ? op.activation_set : 0);
    if (set < offload_pending.size() && offload_pending[set]) {
      compute->WaitEvent(*set_out_done[set], {SpanKind::kWait, "activations out", op.layer});
      offload_pending[set] = false;
    }
  }
  if (op.fetched_activations) {
    compute->WaitEvent(*set_in_ready[op.activation_set],
                       {SpanKind::kWait, "activations in", op.layer});
  }
}

void StreamingExecutor::Impl::AfterActivationOp(const ScheduledOp& op,
                                                std::vector<bool>& offload_pending,
                                                std::vector<ActivationFetch>& pending) {
  if (op.offload_activations) {
    const int set = op.activation_set;
    compute->RecordEvent(*set_written[set]);
    copy_out->WaitEvent(*set_written[set], {SpanKind::kWait, "activations ready", op.layer});
    copy_out->CopyDeviceToHost(offloaded_sets[op.layer].data(), activation_sets[set].data(),
                               sizes.activation_set_bytes,
                               {SpanKind::kCopyOut, std::string(kOffloadLabel), op.layer});
    copy_out->RecordEvent(*set_out_done[set]);
    copy_out->RecordEvent(*offloads_done);
    offload_pending[set] = true;
    traffic.copy_out_bytes += static_cast<double>(sizes.activation_set_bytes);
  }
  for (const ActivationFetch& f : op.fetch_after) {
    compute->RecordEvent(*set_fetch_gate[f.set]);
    pending.push_back(f);
  }
}

const ActivationDecision& StreamingExecutor::activation_decision() const {
  return impl_->activation_decision;
}

size_t StreamingExecutor::activation_set_bytes() const { return impl_->sizes.activation_set_bytes; }

bool StreamingExecutor::ObserveTimeline(const std::vector<TimelineSpan>& spans) {
  Impl& s = *impl_;
  const ActivationMeasurement measured = MeasureFromSpans(spans, s.traffic);
  s.traffic = LayerTraffic{};
  if (s.activation_policy == nullptr) return false;
  const bool changed = s.activation_policy->Observe(measured);
  ActivationDecision decision = s.activation_policy->decision();
  if (absl::Status applied = s.ApplyActivationDecision(decision); !applied.ok()) {
    // No pinned memory for new offloads: those blocks recompute instead.
    for (BlockDecision& block : decision.blocks) {
      if (block.mode != ActivationMode::kOffload) continue;
      block.mode = ActivationMode::kRecompute;
      block.reason = absl::StrCat("recompute: offload wanted but ", applied.message());
    }
    if (!s.ApplyActivationDecision(decision).ok()) return false;
  }
  schedule_ = s.schedule;
  return changed;
}

absl::Status StreamingExecutor::SetBlockModes(const std::vector<ActivationMode>& modes) {
  Impl& s = *impl_;
  ScheduleShape shape = s.layout.schedule;
  shape.block_modes = modes;
  const ActivationDecision decision = ForcedDecision(shape);
  if (absl::Status st = s.ApplyActivationDecision(decision); !st.ok()) return st;
  s.activation_policy.reset();
  schedule_ = s.schedule;
  return absl::OkStatus();
}

}  // namespace megatrain::engine
