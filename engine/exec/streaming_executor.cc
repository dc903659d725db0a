// StreamingExecutor (protocol in streaming_executor.h): creation, device
// buffers, and one micro-batch's op loop over the three streams.
#include "engine/exec/streaming_executor_impl.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/common/parallel_chunks.h"
#include "engine/exec/nvme_weight_copy.h"
#include "engine/exec/stage_backend_factory.h"

namespace megatrain::engine {

using namespace executor_internal;  // NOLINT: the executor's own shapes

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
  // A reduce-scatter of every micro-batch reads world shards: up to world - 1 floats past an entry.
  const size_t grad_padding = ReducesEveryMicroBatch() ? static_cast<size_t>(ReductionWorld()) : 0;
  for (int i = 0; i < 2; ++i)
    grads[i] = alloc((shape.grad_floats + grad_padding) * sizeof(float), "gradient buffer");
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
  segments = alloc(n * sizeof(int32_t), "segment ids");
  if (shape.device_checkpoints < shape.checkpoints) {
    checkpoint_stage = alloc(x_bytes, "checkpoint staging");
  }
  gradient_sums.resize(entry_elements.size());
  if (options.gradient_accumulation == GradientAccumulation::kDevice) {
    const std::vector<bool> summed = DeviceSummedEntries(schedule, entry_elements.size());
    size_t largest = 0;
    for (size_t e = 0; e < summed.size(); ++e) {
      if (!summed[e]) continue;
      const size_t floats =
          DeviceSumFloats(entry_elements[e], ReductionWorld(), ReducesEveryMicroBatch());
      gradient_sums[e] = alloc(floats * sizeof(float), "gradient sum");
      largest = std::max(largest, floats);
    }
    if (ReducesEveryMicroBatch()) reduce_scratch = alloc(largest * sizeof(float), "shard buffer");
  }
  return first_error;
}

absl::Status StreamingExecutor::Impl::AllocatePinnedStaging() {
  const size_t x_bytes = activation_bytes();
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
    gradient_staging_floats = GradientStagingFloats(shape.grad_floats);
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

absl::StatusOr<std::unique_ptr<StreamingExecutor>> StreamingExecutor::Create(
    Device& device, const ModelDims& dims, const ExecutorLayout& layout, ParameterStore& store,
    UpdateGate& gate, const kernels::cpu::RopeTable& rope, const ExecutorOptions& given_options,
    ThreadPool* compute_pool) {
  if (given_options.checkpoint_interval < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint_interval=", given_options.checkpoint_interval, " must be >= 1"));
  }
  if (const int apart = store.placement().rows_gradient_entry;
      apart != -1 &&
      (apart != layout.schedule.embedding_entry || apart != layout.schedule.lm_head_entry)) {
    // Untied, the slab would get no contribution at all with the rows scattered elsewhere.
    return absl::InvalidArgumentError(
        absl::StrCat("rows_gradient_entry=", apart,
                     " keeps a tied embedding's rows' gradient apart: it must "
                     "be the embedding entry (",
                     layout.schedule.embedding_entry, ") and the LM head's (",
                     layout.schedule.lm_head_entry, ")"));
  }
  if (dims.head_chunk < 1) {
    return absl::InvalidArgumentError(absl::StrCat("head_chunk=", dims.head_chunk));
  }
  if (given_options.weight_slots == 1 || given_options.weight_slots < 0) {
    return absl::InvalidArgumentError(absl::StrCat("weight_slots=", given_options.weight_slots,
                                                   " must be 0 (auto) or >= 2 (double buffering)"));
  }
  if (given_options.device_checkpoints < kAutoDeviceCheckpoints) {
    return absl::InvalidArgumentError(
        absl::StrCat("device_checkpoints=", given_options.device_checkpoints,
                     " must be -1 (as many as fit the arena) or >= 0"));
  }
  if (DeviceReduction* reduction = given_options.device_reduction; reduction != nullptr) {
    if (given_options.reduction_rank < 0 || given_options.reduction_rank >= reduction->world()) {
      return absl::InvalidArgumentError(
          absl::StrCat("reduction_rank=", given_options.reduction_rank,
                       " is outside the device reduction's world of ", reduction->world()));
    }
    if (given_options.gradient_accumulation != GradientAccumulation::kDevice) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a device reduction reduce-scatters the devices' gradient sums: it needs "
          "gradient_accumulation=device, not ",
          std::string(GradientAccumulationName(given_options.gradient_accumulation))));
    }
    if (given_options.reduce_every_micro_batch && given_options.weight_ring_bytes > 0) {
      return absl::InvalidArgumentError(
          "reduce_every_micro_batch reduce-scatters whole entries from the gradient buffer; the "
          "weight ring (weight_ring_bytes > 0) sends the LM head's in blocks");
    }
    if (layout.schedule.embedding_entry == layout.schedule.lm_head_entry) {
      // The LM head's part of a tied embedding goes out in turns, before the reduce-scatters on
      // the same stream: device 1 would wait for device 0's rows while device 0 waits in a
      // reduce-scatter for device 1.
      return absl::InvalidArgumentError(
          "a device reduction needs an untied embedding: a tied one's gradient is summed on the "
          "host in micro-batch order (tie_word_embeddings); reduce on the host");
    }
    for (int e = 0; e < store.num_entries(); ++e) {
      if (store.grad_on_nvme(e)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "a device reduction writes each device's shard of an entry's gradient; entry ", e,
            "'s gradient is on NVMe (memory.grad_on_nvme), whose chunks take whole "
            "contributions in turns: keep gradients in RAM or reduce on the host"));
      }
    }
  }
  // Auto device checkpoints resolved once: everything below plans and runs that count.
  ExecutorOptions options = given_options;
  options.gradient_accumulation =
      ResolveGradientAccumulation(dims, layout, EntryElements(store), given_options,
                                  device.arena_stats().capacity, device.kind());
  options.device_checkpoints =
      ChooseDeviceCheckpoints(dims, layout, EntryElements(store), given_options,
                              device.arena_stats().capacity, device.kind());
  absl::StatusOr<std::unique_ptr<StageBackend>> backend =
      MakeStageBackend(device, dims, layout.layer_offsets, rope, compute_pool);
  if (!backend.ok()) return backend.status();
  auto impl = std::make_unique<Impl>(device, dims, WithOptions(layout, options), store, gate,
                                     options, *std::move(backend));
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
    // Events for the most fragments any activation modes need: the all-recompute schedule's
    // (SetBlockModes may turn blocks created kept or offloaded to recompute, which adds their
    // recompute forwards).
    ScheduleShape all_recompute = impl->layout.schedule;
    all_recompute.block_modes.clear();
    absl::StatusOr<FragmentPlan> widest = PlanFragments(BuildStepSchedule(all_recompute), in);
    if (!widest.ok()) return widest.status();
    impl->most_fragments = widest->fragments.size();
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
    return absl::ResourceExhaustedError(absl::StrCat(
        "device memory too small for the streaming plan: it needs ", plan.Describe(),
        " (arena capacity ", device.arena_stats().capacity, " bytes)",
        plan.gradient_sums > 0 ? "; gradient_accumulation=device keeps the step's gradient sums "
                                 "on the device (host or auto would not)"
                               : "",
        "; allocation failed: ", s.message()));
  }
  if (absl::Status s = impl->AllocatePinnedStaging(); !s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat("pinned host memory too small for the executor's staging (its "
                               "plan: ",
                               PinnedStagingBytes(dims, layout, impl->entry_elements, options,
                                                  device.kind()),
                               " bytes of host checkpoints, gradient staging, embedding rows and "
                               "more): ",
                               s.message()));
  }
  impl->host_pool = std::make_unique<ThreadPool>(HostChunkThreads());
  for (auto* stream : {&impl->copy_in, &impl->compute, &impl->copy_out}) {
    const char* name = stream == &impl->copy_in   ? "copy_in"
                       : stream == &impl->compute ? "compute"
                                                  : "copy_out";
    absl::StatusOr<std::unique_ptr<Stream>> s = device.CreateStream(name);
    if (!s.ok()) return s.status();
    *stream = std::move(*s);
  }
  if (absl::Status s = impl->ZeroSumPadding(); !s.ok()) return s;
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
      std::max({impl->step_fragments.fragments.size(), impl->eval_fragments.fragments.size(),
                impl->most_fragments});
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
                                             impl->positions.data_as<int32_t>(),
                                             options.segment_ids ? impl->segments.data_as<int32_t>()
                                                                 : nullptr,
                                             *impl->copy_in);
        !s.ok()) {
      return s;
    }
  }
  // The default layout; each micro-batch copies its own or these (UploadTokens).
  impl->default_positions.resize(static_cast<size_t>(dims.tokens()));
  for (size_t t = 0; t < impl->default_positions.size(); ++t) {
    impl->default_positions[t] = static_cast<int32_t>(t % dims.seq);
  }
  impl->default_segments.assign(static_cast<size_t>(dims.tokens()), 0);
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

GradientAccumulation StreamingExecutor::gradient_accumulation() const {
  return impl_->options.gradient_accumulation;
}

bool StreamingExecutor::reduces_every_micro_batch() const {
  return impl_->ReducesEveryMicroBatch();
}

bool StreamingExecutor::reduces_entry(int e) const {
  return impl_->options.device_reduction != nullptr &&
         impl_->gradient_sums[static_cast<size_t>(e)].data() != nullptr;
}

int StreamingExecutor::weight_slots() const { return impl_->slot_policy->num_slots(); }

bool StreamingExecutor::fragment_mode() const { return impl_->fragment_mode(); }

double StreamingExecutor::layer_link_bytes() const {
  return impl_->traffic.copy_in_bytes + impl_->traffic.copy_out_bytes;
}

int StreamingExecutor::step_fragment_count() const {
  return static_cast<int>(impl_->step_fragments.fragments.size());
}

void StreamingExecutor::InvalidateWeights() {
  impl_->slot_policy = std::make_unique<WeightSlotPolicy>(impl_->slot_policy->num_slots());
}

absl::StatusOr<MicroBatchResult> StreamingExecutor::RunMicroBatch(
    const int32_t* inputs, const int32_t* targets, float inv_total_valid, bool first_micro_batch,
    uint64_t weights_version, TokenLayout layout, MicroBatchTurns turns,
    const std::function<void(int)>& on_gradient_final, bool last_micro_batch) {
  if (turns.turns != nullptr && impl_->options.device_reduction == nullptr &&
      impl_->options.gradient_accumulation == GradientAccumulation::kDevice) {
    // Several devices add into one store's slabs in global micro-batch order; a device's own sum
    // of its micro-batches would reorder those adds.
    return absl::FailedPreconditionError(
        "gradient_accumulation=device sums one executor's micro-batches; with several devices "
        "on one store (MicroBatchTurns) use host");
  }
  impl_->BeginTurns(impl_->schedule, turns);
  absl::StatusOr<MicroBatchResult> result =
      impl_->Run(impl_->schedule, inputs, targets, inv_total_valid, first_micro_batch,
                 weights_version, layout, on_gradient_final, last_micro_batch);
  impl_->turns = {};
  return result;
}

absl::StatusOr<MicroBatchResult> StreamingExecutor::EvaluateMicroBatch(const int32_t* inputs,
                                                                       const int32_t* targets,
                                                                       uint64_t weights_version,
                                                                       TokenLayout layout) {
  return impl_->Run(impl_->eval_schedule, inputs, targets, 0.0f, false, weights_version, layout);
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

absl::Status StreamingExecutor::Impl::UploadTokens(const int32_t* inputs, const int32_t* targets,
                                                   TokenLayout layout) {
  Impl& s = *this;
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
  if (layout.segments != nullptr && !s.options.segment_ids) {
    return absl::InvalidArgumentError(
        "the micro-batch carries segment ids but the executor was created without "
        "ExecutorOptions.segment_ids");
  }
  const int32_t* positions =
      layout.positions != nullptr ? layout.positions : s.default_positions.data();
  const int32_t* segments = layout.segments != nullptr ? layout.segments : s.default_segments.data();
  for (size_t t = 0; t < n; ++t) {
    if (positions[t] < 0 || positions[t] >= m.seq) {
      return absl::InvalidArgumentError(absl::StrCat("position ", positions[t], " of token ", t,
                                                     " is outside [0, seq = ", m.seq, ")"));
    }
    if (t % static_cast<size_t>(m.seq) != 0 && segments[t] < segments[t - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "segment id ", segments[t], " of token ", t, " is below the previous token's ",
          segments[t - 1], " (segments must be contiguous runs, ids non-decreasing)"));
    }
  }
  s.host_ids.assign(inputs, inputs + n);
  s.host_targets.assign(targets, targets + n);
  s.copy_in->CopyHostToDevice(s.ids.data(), inputs, n * sizeof(int32_t),
                              {SpanKind::kCopyIn, "token ids", -1});
  s.copy_in->CopyHostToDevice(s.targets.data(), targets, n * sizeof(int32_t),
                              {SpanKind::kCopyIn, "targets", -1});
  s.copy_in->CopyHostToDevice(s.positions.data(), positions, n * sizeof(int32_t),
                              {SpanKind::kCopyIn, "positions", -1});
  if (s.options.segment_ids) {
    s.copy_in->CopyHostToDevice(s.segments.data(), segments, n * sizeof(int32_t),
                                {SpanKind::kCopyIn, "segment ids", -1});
  }
  s.copy_in->RecordEvent(*s.tokens_ready);
  s.compute->WaitEvent(*s.tokens_ready, {SpanKind::kWait, "tokens", -1});
  return absl::OkStatus();
}

void StreamingExecutor::Impl::EnqueueCheckpointIn(const ScheduledOp& op) {
  Impl& s = *this;
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

void StreamingExecutor::Impl::EnqueueSlotCopy(const ScheduledOp& op,
                                              const std::vector<size_t>& offsets, int slot,
                                              uint64_t weights_version, bool training) {
  Impl& s = *this;
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

void StreamingExecutor::Impl::EnqueueCheckpointSave(const ScheduledOp& op, const void* x_in,
                                                    bool& pending_checkpoint_wait) {
  Impl& s = *this;
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
}

absl::Status StreamingExecutor::Impl::EnqueueStageGradientsOut(const ScheduledOp& op,
                                                               const std::vector<size_t>& offsets,
                                                               int grad,
                                                               std::vector<bool>& contributed,
                                                               bool training) {
  Impl& s = *this;
  const float* buffer = s.grads[grad].data_as<float>();
  bool all_summed = true;
  for (size_t i = 0; i < op.entries.size(); ++i) {
    const int e = op.entries[i];
    all_summed = all_summed && s.SummedOnDevice(e);
    MT_RETURN_IF_ERROR(s.EnqueueDeviceSum(e, buffer + offsets[i], 0, s.store.spec(e).elements,
                                          {SpanKind::kCompute, DescribeOp(op), op.layer}));
  }
  // Summed on the device, the buffer is consumed by the compute stream's add: free it there, not
  // behind copy_out (which may be waiting in a reduce-scatter for a slower peer). Reduced every
  // micro-batch, copy_out's reduce-scatter reads it.
  if (all_summed && !s.ReducesEveryMicroBatch()) s.compute->RecordEvent(*s.grad_free[grad]);
  s.compute->RecordEvent(*s.grad_ready[grad]);
  s.copy_out->WaitEvent(*s.grad_ready[grad], {SpanKind::kWait, "gradients ready", op.layer});
  for (size_t i = 0; i < op.entries.size(); ++i) {
    const int e = op.entries[i];
    absl::StatusOr<size_t> sent =
        s.EnqueueContributionOut(e, buffer + offsets[i], 0, s.store.spec(e).elements,
                                 !contributed[e], {SpanKind::kCopyOut, DescribeOp(op), op.layer});
    if (!sent.ok()) return sent.status();
    if (training && op.layer >= 0) s.traffic.copy_out_bytes += static_cast<double>(*sent);
    contributed[e] = true;
  }
  if (!all_summed || s.ReducesEveryMicroBatch()) s.copy_out->RecordEvent(*s.grad_free[grad]);
  s.copy_out->RecordEvent(*s.copy_out_done);
  return absl::OkStatus();
}

absl::StatusOr<MicroBatchResult> StreamingExecutor::Impl::Run(
    const std::vector<ScheduledOp>& ops, const int32_t* inputs, const int32_t* targets,
    float inv_total_valid, bool first_micro_batch, uint64_t weights_version, TokenLayout layout,
    const std::function<void(int)>& on_gradient_final, bool last_micro_batch) {
  Impl& s = *this;
  // Per entry, the op whose gradient copy-out is the entry's last of the micro-batch.
  std::vector<int> last_gradient_op;
  if (on_gradient_final) {
    last_gradient_op.assign(static_cast<size_t>(s.store.num_entries()), -1);
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].kind == StageKind::kEmbedBackward) {
        last_gradient_op[ops[i].host_entry] = static_cast<int>(i);
      } else if (ops[i].produces_gradients) {
        for (int e : ops[i].entries) last_gradient_op[e] = static_cast<int>(i);
      }
    }
  }
  // After op `index`'s copy-out tasks in copy_out order: the entries it finished.
  auto signal_final_gradients = [&](int index) {
    if (!on_gradient_final) return;
    std::vector<int> finished;
    for (int e = 0; e < static_cast<int>(last_gradient_op.size()); ++e) {
      if (last_gradient_op[e] == index) finished.push_back(e);
    }
    if (finished.empty()) return;
    s.copy_out->EnqueueHostTask(
        [callback = on_gradient_final, finished] {
          for (int e : finished) callback(e);
        },
        {SpanKind::kCopyOut, "gradients final", -1});
  };
  const bool training = &ops == &s.schedule;
  if (absl::Status h = s.device.health(); !h.ok()) {
    if (training) s.sums_pending = false;  // the step fails; its sums are void
    return h;
  }
  if (absl::Status t = s.UploadTokens(inputs, targets, layout); !t.ok()) {
    if (training) s.sums_pending = false;
    return t;
  }

  // A step of one micro-batch has nothing to sum: its gradients go straight out. A step whose
  // first micro-batch did not start sums (it was also its last, as far as it knew) goes on
  // adding on the host: the slabs already hold its contributions.
  // With a DeviceReduction every device sums, even over one micro-batch: its sums are what the
  // reduce-scatter adds, and the device's first micro-batch of the step starts them.
  const bool reduced = s.options.device_reduction != nullptr;
  s.sums_on_device = training &&
                     s.options.gradient_accumulation == GradientAccumulation::kDevice &&
                     (reduced || (first_micro_batch ? !last_micro_batch : s.sums_pending));
  s.sums_start = reduced ? s.turns.first_on_device : first_micro_batch;
  s.sums_go_out = last_micro_batch;
  if (training) s.sums_pending = s.sums_on_device && !last_micro_batch;
  if (training && first_micro_batch) s.EnqueueRowsGradientReset();
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
      signal_final_gradients(op_index);
      continue;
    }
    size_t stage_floats = 0;
    const std::vector<size_t> offsets = StageOffsets(s.entry_elements, op.entries, &stage_floats);
    const bool host_checkpoint_in = op.kind == StageKind::kLayerForward && op.recompute &&
                                    op.checkpoint >= 0 && s.CheckpointOnHost(op.checkpoint);
    if (host_checkpoint_in) s.EnqueueCheckpointIn(op);
    // Fragment mode copies weights part by part in EnqueueFragmentedOp.
    const WeightSlotPolicy::Decision placed =
        s.fragment_mode() ? WeightSlotPolicy::Decision{-1, false}
                          : s.slot_policy->Place(op.entries, weights_version);
    const int slot = placed.slot;
    if (placed.copy) s.EnqueueSlotCopy(op, offsets, slot, weights_version, training);
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

    s.EnqueueCheckpointSave(op, x_in, pending_checkpoint_wait);

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
      launch_status = s.EnqueueStageGradientsOut(op, offsets, grad, contributed, training);
      if (!launch_status.ok()) break;  // what is queued still drains below
      grad ^= 1;
    }
    // A fragmented head enqueued its copy-outs part by part above.
    if (op.produces_gradients) signal_final_gradients(op_index);

    // Advance the residual streams.
    if (op.kind == StageKind::kLayerForward) xi ^= 1;
    if (op.kind == StageKind::kLayerBackward) dxi ^= 1;
  }

  s.EnqueueFetches(pending_fetches);  // none left when the schedule is whole
  absl::Status status = launch_status;
  for (Stream* stream : {s.copy_in.get(), s.compute.get(), s.copy_out.get()}) {
    status.Update(stream->Synchronize());
  }
  // A stream that failed skips its later host tasks, the wait for the pool's adds among them:
  // no add may still write a slab once this returns.
  s.staged_adds[0].Wait();
  s.staged_adds[1].Wait();
  if (!status.ok()) {
    s.sums_pending = false;  // the step fails; its sums are void
    return status;
  }
  const HeadResultSum head = s.backend->head_result();
  return MicroBatchResult{head.loss_sum, head.valid_tokens};
}

}  // namespace megatrain::engine
