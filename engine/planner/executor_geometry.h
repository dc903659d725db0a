// The streaming executor's shapes for a model and batch without allocating a ParameterStore:
// ModelDims, ExecutorLayout and per-entry element counts, and the device plan from them.
//
// Why a second path: StreamingExecutor::PlanDeviceMemory takes a ParameterStore, whose creation
// allocates and zeroes every host buffer (16 bytes per parameter), so a 32B-parameter plan cannot
// call it. DeviceMemoryPlanFor computes the same plan from the entry sizes, reusing the
// executor's own size functions (LayerActivations/LayerBackwardScratch/HeadScratch::FloatCount,
// AttentionWorkspaceFloats, ActivationSetCount, CheckpointCount, BuildStepSchedule);
// tests/planner/device_plan_test checks it equals the executor's plan byte for byte.
#pragma once

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/exec/model_dims.h"
#include "engine/exec/step_schedule.h"
#include "engine/exec/streaming_executor.h"
#include "engine/model/model_config.h"
#include "engine/model/parameter_layout.h"

namespace megatrain::engine::planner {

struct ExecutorGeometry {
  ModelDims dims;
  ExecutorLayout layout;
  std::vector<size_t> entry_elements;  // padded floats of each layout entry
};

// As Trainer::Create builds them (head_chunk 0 = min(tokens, 256)).
absl::StatusOr<ExecutorGeometry> MakeExecutorGeometry(const ModelConfig& config,
                                                      const ParameterLayout& layout,
                                                      int micro_batch, int seq, int head_chunk,
                                                      const ExecutorOptions& options);

// Equals StreamingExecutor::PlanDeviceMemory(dims, layout, store, options, weight_slots) for a
// store with these entry sizes.
DeviceMemoryPlan DeviceMemoryPlanFor(const ExecutorGeometry& g, const ExecutorOptions& options,
                                     int weight_slots);

// The slot count StreamingExecutor::Create picks for options.weight_slots (0 = auto within an
// arena of `arena_bytes`).
int WeightSlotsFor(const ExecutorGeometry& g, const ExecutorOptions& options, size_t arena_bytes);

// Float offsets of an op's entries packed into one slot, and the total (the executor's packing).
size_t StageFloats(const ExecutorGeometry& g, const std::vector<int>& entries);

}  // namespace megatrain::engine::planner
