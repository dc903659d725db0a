// StreamingExecutor's ops: each stage's math on the compute stream (whole
// slots), the head's forms, gradients copied out into RAM or NVMe, and the
// host embedding's gather and scatter.
#include "engine/exec/streaming_executor_impl.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "engine/exec/nvme_gradient_offload.h"

namespace megatrain::engine {

using namespace executor_internal;  // NOLINT: the executor's own shapes

namespace {
// Floats of one task of the rows' gradient reset.
constexpr size_t kRowsResetFloats = size_t{1} << 20;
}  // namespace

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
        args.gradient_buffer = g;
        args.grad_floats = grad_floats;
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

void StreamingExecutor::Impl::BeginTurns(const std::vector<ScheduledOp>& ops,
                                         MicroBatchTurns micro_batch_turns) {
  turns = micro_batch_turns;
  if (turns.turns == nullptr) return;
  contributions_per_micro_batch.assign(static_cast<size_t>(store.num_entries()), 0);
  contributions_enqueued.assign(static_cast<size_t>(store.num_entries()), 0);
  for (const ScheduledOp& op : ops) {
    if (op.kind == StageKind::kEmbedBackward) {
      ++contributions_per_micro_batch[op.host_entry];
    } else if (op.produces_gradients) {
      for (int e : op.entries) ++contributions_per_micro_batch[e];
    }
  }
}

void StreamingExecutor::Impl::EnqueueTurnWait(int e, int layer) {
  if (turns.turns == nullptr) return;
  const uint64_t turn =
      static_cast<uint64_t>(turns.micro_batch) * contributions_per_micro_batch[e] +
      contributions_enqueued[e];
  GradientTurns* gate = turns.turns;
  // Aborted (another micro-batch failed): the step fails, so what lands no longer matters.
  copy_out->EnqueueHostTask([gate, e, turn] { gate->WaitForTurn(e, turn); },
                            {SpanKind::kWait, "gradient turn", layer});
}

void StreamingExecutor::Impl::EnqueueTurnLanded(int e, int layer) {
  if (turns.turns == nullptr) return;
  const uint64_t turn =
      static_cast<uint64_t>(turns.micro_batch) * contributions_per_micro_batch[e] +
      contributions_enqueued[e];
  ++contributions_enqueued[e];
  GradientTurns* gate = turns.turns;
  copy_out->EnqueueHostTask([gate, e, turn] { gate->Landed(e, turn); },
                            {SpanKind::kCopyOut, "gradient landed", layer});
}

absl::Status StreamingExecutor::Impl::EnqueueDeviceSum(int e, const float* src, size_t first,
                                                       size_t count, const TimelineTag& tag) {
  // Reduced every micro-batch, the shard is summed on copy_out (EnqueueShardReduction).
  if (!SummedOnDevice(e) || ReducesEveryMicroBatch()) return absl::OkStatus();
  float* sum = gradient_sums[static_cast<size_t>(e)].data_as<float>() + first;
  const TimelineTag sum_tag{SpanKind::kCompute, "sum gradients", tag.layer};
  // The first contribution is copied, as the host's first is: 0 + g would turn -0.0 into +0.0.
  if (sums_start) {
    compute->CopyDeviceToDevice(sum, src, count * sizeof(float), sum_tag);
    return absl::OkStatus();
  }
  return backend->AccumulateGradients(*compute, src, count, sum, sum_tag);
}

absl::StatusOr<size_t> StreamingExecutor::Impl::EnqueueContributionOut(
    int e, const float* src, size_t first, size_t count, bool overwrite, const TimelineTag& tag) {
  if (SummedOnDevice(e) && ReducesEveryMicroBatch()) return EnqueueShardReduction(e, src, tag);
  if (SummedOnDevice(e)) {
    if (!sums_go_out) return 0;
    if (options.device_reduction != nullptr) {
      // The entry is reduced whole at its last part (the fragmented head's last block): by
      // then the compute stream has summed every part, and the copy_out stream waited for it.
      if (first + count != store.spec(e).elements) return 0;
      return EnqueueReducedShardOut(e, tag);
    }
    src = gradient_sums[static_cast<size_t>(e)].data_as<float>() + first;
    overwrite = true;
  }
  EnqueueGradientCopyOut(e, src, first, count, overwrite, tag);
  return count * sizeof(float);
}

absl::StatusOr<size_t> StreamingExecutor::Impl::EnqueueReducedShardOut(int e,
                                                                       const TimelineTag& tag) {
  DeviceReduction& reduction = *options.device_reduction;
  const int rank = options.reduction_rank;
  const size_t n = store.spec(e).elements;
  const size_t shard = ReductionShardElements(n, reduction.world());
  float* sums = gradient_sums[static_cast<size_t>(e)].data_as<float>();
  // On copy_out, which before it waits only for the compute stream and for earlier
  // reduce-scatters: the one turn left in a reduced step, the embedding rows', comes after every
  // reduce-scatter of the micro-batch. (A tied embedding, whose LM-head part would wait for a
  // turn before them, is refused.) So the ranks never wait on each other in a circle.
  MT_RETURN_IF_ERROR(reduction.EnqueueReduceScatter(
      rank, *copy_out, sums, sums + static_cast<size_t>(rank) * shard, shard,
      {SpanKind::kCopyOut, kReduceScatterLabel, tag.layer}));
  return EnqueueOwnShardOut(e, sums + static_cast<size_t>(rank) * shard, shard, tag);
}

size_t StreamingExecutor::Impl::EnqueueOwnShardOut(int e, const float* shard_sums, size_t shard,
                                                   const TimelineTag& tag) {
  const size_t n = store.spec(e).elements;
  const size_t begin = std::min(n, static_cast<size_t>(options.reduction_rank) * shard);
  const size_t end = std::min(n, begin + shard);
  // Disjoint ranges per device, each written once a step: no turns, and the first write of the
  // step overwrites.
  if (end > begin) EnqueueGradientRanges(e, shard_sums, begin, end - begin, true, tag);
  return (end - begin) * sizeof(float);
}

absl::StatusOr<size_t> StreamingExecutor::Impl::EnqueueShardReduction(int e, const float* src,
                                                                      const TimelineTag& tag) {
  DeviceReduction& reduction = *options.device_reduction;
  const int rank = options.reduction_rank;
  const size_t n = store.spec(e).elements;
  const size_t shard = ReductionShardElements(n, reduction.world());
  float* sums = gradient_sums[static_cast<size_t>(e)].data_as<float>();
  // The device's first micro-batch of the step lands in its shard's sum; later ones in the shard
  // buffer, then added (the compute stream's next op waits for the gradient buffer, grad_free,
  // until this has read it).
  float* recv = sums_start ? sums : reduce_scratch.data_as<float>();
  MT_RETURN_IF_ERROR(reduction.EnqueueReduceScatter(
      rank, *copy_out, src, recv, shard, {SpanKind::kCopyOut, kReduceScatterLabel, tag.layer}));
  if (!sums_start) {
    MT_RETURN_IF_ERROR(backend->AccumulateGradients(
        *copy_out, recv, shard, sums, {SpanKind::kCopyOut, "sum shard", tag.layer}));
  }
  if (!sums_go_out) return 0;
  return EnqueueOwnShardOut(e, sums, shard, tag);
}

absl::Status StreamingExecutor::Impl::ZeroSumPadding() {
  const int world = ReductionWorld();
  if (world == 1) return absl::OkStatus();
  // The regions a reduce-scatter reads but no device copies out: the padding of whole sums to N
  // shards, or, reduced every micro-batch, the gradient buffers (read up to world - 1 floats past
  // an op's last entry). Zeroed once, so it never reads uninitialized memory.
  std::vector<std::pair<char*, size_t>> regions;
  if (ReducesEveryMicroBatch()) {
    for (DeviceBuffer& g : grads) regions.emplace_back(static_cast<char*>(g.data()), g.size());
  } else {
    for (size_t e = 0; e < gradient_sums.size(); ++e) {
      if (gradient_sums[e].data() == nullptr) continue;
      const size_t padding = DeviceSumFloats(entry_elements[e], world) - entry_elements[e];
      if (padding == 0) continue;
      regions.emplace_back(
          reinterpret_cast<char*>(gradient_sums[e].data_as<float>() + entry_elements[e]),
          padding * sizeof(float));
    }
  }
  size_t chunk = 0;
  for (const auto& [dst, bytes] : regions) {
    chunk = std::max(chunk, std::min<size_t>(bytes, size_t{16} << 20));
  }
  if (chunk == 0) return absl::OkStatus();
  const std::vector<char> zeros(chunk, 0);  // outlives the copies: synchronized below
  for (const auto& [dst, bytes] : regions) {
    for (size_t done = 0; done < bytes; done += chunk) {
      compute->CopyHostToDevice(dst + done, zeros.data(), std::min(chunk, bytes - done),
                                {SpanKind::kOther, "reduction padding zero", -1});
    }
  }
  return compute->Synchronize();
}

void StreamingExecutor::Impl::EnqueueGradientCopyOut(int e, const float* src, size_t first,
                                                     size_t count, bool overwrite,
                                                     const TimelineTag& tag) {
  // An entry's contribution may go out in ranges (the fragmented head's
  // blocks), in increasing order: its turn spans the first to the last.
  if (first == 0) EnqueueTurnWait(e, tag.layer);
  EnqueueGradientRanges(e, src, first, count, overwrite, tag);
  if (first + count == store.spec(e).elements) EnqueueTurnLanded(e, tag.layer);
}

void StreamingExecutor::Impl::EnqueueGradientRanges(int e, const float* src, size_t first,
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
  // The add is element-wise, so threads over disjoint ranges give the same bits. On one thread,
  // with one staging buffer the next copy waited for, it took 8.7 s of a 12.4 s step with four
  // micro-batches on the first H100 run (1.26 ms per 4 MB, docs/gpu.md). Now the pool adds one
  // buffer while the next chunk's copy fills the other.
  Impl* self = this;
  int buffer = 0;
  for (size_t done = 0; done < count; done += kGradientStagingFloats) {
    const size_t n = std::min(kGradientStagingFloats, count - done);
    float* staged = gradient_staging.data_as<float>() + buffer * gradient_staging_floats;
    copy_out->EnqueueHostTask([self, buffer] { self->staged_adds[buffer].Wait(); },
                              {SpanKind::kWait, "staging buffer free", tag.layer});
    copy_out->CopyDeviceToHost(staged, src + done, n * sizeof(float), tag);
    copy_out->EnqueueHostTask(
        [self, buffer, staged, slab = slab + done, n] {
          // Tasks of 1024-float multiples, at most one per pool thread.
          const size_t tasks =
              n >= (size_t{1} << 18) ? std::min<size_t>(self->host_pool->num_threads(), n / 1024)
                                     : 1;
          const size_t per_task = ((n + tasks - 1) / tasks + 1023) / 1024 * 1024;
          self->staged_adds[buffer] = self->host_pool->SubmitParallelFor(
              tasks, [staged, slab, n, per_task](size_t t) {
                const size_t end = std::min(n, (t + 1) * per_task);
                for (size_t j = t * per_task; j < end; ++j) slab[j] += staged[j];
              });
        },
        {SpanKind::kCopyOut, "accumulate gradients", tag.layer});
    buffer ^= 1;
  }
  copy_out->EnqueueHostTask(
      [self] {
        self->staged_adds[0].Wait();
        self->staged_adds[1].Wait();
      },
      {SpanKind::kWait, "gradients added", tag.layer});
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

void StreamingExecutor::Impl::EnqueueRowsGradientReset() {
  const int e = layout.schedule.embedding_entry;
  float* apart = store.rows_gradient(e);
  if (apart == nullptr) return;
  const size_t n = store.spec(e).elements;
  ThreadPool* pool = host_pool.get();
  // -0.0 is the one float x + (-0.0) leaves unchanged for every x (+0.0 would turn a -0.0 into
  // +0.0): rows no token of the step touches then add nothing when the ranks' reduction adds this
  // array after the LM head's gradient, as one process adds nothing to them. Enqueued at the start
  // of the step's first micro-batch, so the copy_out stream clears it while the forward runs.
  copy_out->EnqueueHostTask(
      [apart, n, pool] {
        pool->ParallelFor((n + kRowsResetFloats - 1) / kRowsResetFloats, [apart, n](size_t t) {
          std::fill(apart + t * kRowsResetFloats, apart + std::min(n, (t + 1) * kRowsResetFloats),
                    -0.0f);
        });
      },
      {SpanKind::kCopyOut, "embed.rows reset", -1});
}

void StreamingExecutor::Impl::EnqueueEmbeddingBackward(const ScheduledOp& op, const void* dx_out,
                                                       bool first_contribution) {
  const int e = op.host_entry;
  void* rows = embedding_rows.data();
  // A tied embedding on a data-parallel rank scatters its rows apart from the LM head's gradient
  // (StorePlacement::rows_gradient_entry), adding to the -0.0 of EnqueueRowsGradientReset.
  float* apart = store.rows_gradient(e);
  float* slab = apart != nullptr ? apart : store.entry(e).grad;
  if (apart != nullptr) first_contribution = false;
  compute->RecordEvent(*embedding_grad_ready);
  copy_out->WaitEvent(*embedding_grad_ready, {SpanKind::kWait, "gradients ready", -1});
  copy_out->CopyDeviceToHost(rows, dx_out, activation_bytes(),
                             {SpanKind::kCopyOut, DescribeOp(op), -1});
  Impl* self = this;
  EnqueueTurnWait(e, -1);
  copy_out->EnqueueHostTask(
      [self, rows, slab, first_contribution] {
        self->backend->ScatterEmbeddingGradients(rows, self->host_ids.data(), first_contribution,
                                                 slab);
      },
      {SpanKind::kCopyOut, "embed.scatter", -1});
  EnqueueTurnLanded(e, -1);
  copy_out->RecordEvent(*copy_out_done);
}

}  // namespace megatrain::engine
