// StreamingExecutor's weight ring (fragment mode): the fragment copies in
// plan order, running ahead of compute, and each op run part by part.
#include "engine/exec/streaming_executor_impl.h"

#include "engine/exec/nvme_weight_copy.h"

namespace megatrain::engine {

using namespace executor_internal;  // NOLINT: the executor's own shapes

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
          // The last block carries the entry's padding out too (zeroed).
          if (step.block + 1 == HeadBlockCount(dims)) {
            grad_count = store.spec(grad_entry).elements - grad_first;
          }
          args.lm_head_grad = grads[grad].data_as<float>();
        } else if (op.produces_gradients && step.kind == HeadStepKind::kNormBackward) {
          grad_entry = op.entries[0];
          grad_count = store.spec(grad_entry).elements;
          args.final_norm_grad = grads[grad].data_as<float>();
        }
        if (grad_entry >= 0) {
          args.gradient_buffer = grads[grad].data_as<float>();
          args.grad_floats = grad_count;
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
    // Summed on the device, the part's buffer is free once the compute stream has added it.
    const bool summed = grad_entry >= 0 && SummedOnDevice(grad_entry);
    if (grad_entry >= 0) {
      MT_RETURN_IF_ERROR(EnqueueDeviceSum(grad_entry, grads[grad].data_as<float>(), grad_first,
                                          grad_count, tag));
      if (summed) compute->RecordEvent(*grad_free[grad]);
    }
    for (int f : part.frees) compute->RecordEvent(*fragment_free[f]);
    compute->RecordEvent(*compute_done);
    if (grad_entry >= 0) {
      // The part's gradient goes out while the next part computes into the other buffer.
      compute->RecordEvent(*grad_ready[grad]);
      copy_out->WaitEvent(*grad_ready[grad], {SpanKind::kWait, "gradients ready", op.layer});
      MT_RETURN_IF_ERROR(EnqueueContributionOut(grad_entry, grads[grad].data_as<float>(),
                                                grad_first, grad_count, !contributed[grad_entry],
                                                {SpanKind::kCopyOut, DescribeOp(op), op.layer})
                             .status());
      if (!summed) copy_out->RecordEvent(*grad_free[grad]);
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

}  // namespace megatrain::engine
