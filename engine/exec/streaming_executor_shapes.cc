// The executor's static shapes (streaming_executor_shapes.h).
#include "engine/exec/streaming_executor_shapes.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace megatrain::engine::executor_internal {

size_t GradientStagingFloats(size_t grad_floats) {
  // Rounded up to 256 bytes, so the second buffer starts aligned.
  return AlignFloats(std::min(grad_floats, kGradientStagingFloats));
}

size_t GradientStagingBytes(size_t grad_floats) {
  return 2 * GradientStagingFloats(grad_floats) * sizeof(float) + 64;
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


// Floats of the gradient buffer an op writes. A fragmented head writes one
// vocabulary block's or the final norm's gradient at a time.
}  // namespace megatrain::engine::executor_internal

namespace megatrain::engine {

std::vector<bool> DeviceSummedEntries(const std::vector<ScheduledOp>& schedule,
                                      size_t num_entries) {
  std::vector<bool> summed(num_entries, false), host(num_entries, false);
  for (const ScheduledOp& op : schedule) {
    if (op.kind == StageKind::kEmbedBackward) {
      host[static_cast<size_t>(op.host_entry)] = true;
    } else if (op.produces_gradients) {
      for (int e : op.entries) summed[static_cast<size_t>(e)] = true;
    }
  }
  for (size_t e = 0; e < num_entries; ++e) summed[e] = summed[e] && !host[e];
  return summed;
}

}  // namespace megatrain::engine

namespace megatrain::engine::executor_internal {

size_t DeviceSumFloats(size_t elements, int reduction_world, bool shards) {
  const size_t shard = ReductionShardElements(elements, reduction_world);
  return shards ? shard : shard * static_cast<size_t>(reduction_world);
}

size_t DeviceSumBytes(const std::vector<ScheduledOp>& schedule,
                      absl::Span<const size_t> entry_elements, int reduction_world, bool shards) {
  const std::vector<bool> summed = DeviceSummedEntries(schedule, entry_elements.size());
  size_t bytes = 0, largest = 0;
  for (size_t e = 0; e < summed.size(); ++e) {
    if (!summed[e]) continue;
    const size_t floats = DeviceSumFloats(entry_elements[e], reduction_world, shards);
    bytes += Round256(floats * sizeof(float));
    largest = std::max(largest, floats);
  }
  return shards ? bytes + Round256(largest * sizeof(float)) : bytes;
}

size_t GradientFloats(const ModelDims& dims, absl::Span<const size_t> entry_elements,
                      const ExecutorOptions& options, const ScheduledOp& op) {
  if (options.weight_ring_bytes > 0 && op.kind == StageKind::kHead) {
    // A block's gradient, the last one with the entry's padding (under 64 floats).
    return std::max(
        AlignFloats(static_cast<size_t>(HeadBlockRows(dims) * dims.hidden) + kEntryAlignFloats),
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

}  // namespace megatrain::engine::executor_internal
