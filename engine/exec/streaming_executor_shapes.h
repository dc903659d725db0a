// The executor's static shapes, shared by its planning and its running: the
// packing of an op's entries into one slot or gradient buffer, the gradient
// buffer an op writes, the plan's counts (slots, sets, checkpoints), and the
// options' view of the layout. Private to engine/exec's streaming executor.
#pragma once

#include <cstddef>
#include <vector>

#include "absl/types/span.h"
#include "engine/exec/activation_policy.h"
#include "engine/exec/model_dims.h"
#include "engine/exec/parameter_store.h"
#include "engine/exec/stage_backend.h"
#include "engine/exec/step_schedule.h"
#include "engine/exec/streaming_executor.h"

namespace megatrain::engine::executor_internal {

inline constexpr size_t kEntryAlignFloats = 64;
// Chunk of later gradient contributions staged on the host (4 MiB).
inline constexpr size_t kGradientStagingFloats = size_t{1} << 20;

// Floats of one of the two staging buffers later contributions alternate between (a chunk, or
// less when no op's gradients are that large), and the pinned bytes of both.
size_t GradientStagingFloats(size_t grad_floats);
size_t GradientStagingBytes(size_t grad_floats);
// One [tokens, hidden] activation tensor of the backend (residual stream,
// checkpoint, embedding rows).
size_t ActivationBytes(const ModelDims& dims, const StageSizes& sizes);
size_t AlignFloats(size_t n);
size_t Round256(size_t bytes);
// Float offsets of each of an op's entries when packed into one slot.
std::vector<size_t> StageOffsets(absl::Span<const size_t> entry_elements,
                                 const std::vector<int>& entries, size_t* total_floats);
std::vector<size_t> EntryElements(const ParameterStore& store);
// The layout's schedule with the options' checkpointing applied.
ExecutorLayout WithOptions(ExecutorLayout layout, const ExecutorOptions& options);
// Device bytes of those sums (each entry's fp32 array, 256-byte aligned).
// Floats of one entry's device sum: its elements padded to a multiple of the reduction's world
// (1 without a DeviceReduction), as a reduce-scatter takes shard * world.
// With reduce_every_micro_batch (`shards`): the device's shard of it, ceil(elements / world).
size_t DeviceSumFloats(size_t elements, int reduction_world, bool shards = false);
// Of every summed entry; with `shards` also the shard buffer (the largest shard).
size_t DeviceSumBytes(const std::vector<ScheduledOp>& schedule,
                      absl::Span<const size_t> entry_elements, int reduction_world,
                      bool shards = false);

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
                      const ExecutorOptions& options, const ScheduledOp& op);
PlanShape ShapePlan(const ModelDims& dims, const ExecutorLayout& layout,
                    absl::Span<const size_t> entry_elements, const ExecutorOptions& options,
                    const std::vector<ScheduledOp>& schedule);
// The decision of modes set by hand (options.block_modes, SetBlockModes).
ActivationDecision ForcedDecision(const ScheduleShape& shape);

}  // namespace megatrain::engine::executor_internal
