// The planner's view of the streaming executor: the geometry the trainer
// builds (engine/exec/executor_geometry.h) and the executor's own device plan,
// slot choice and slot packing, computed from entry sizes without allocating.
#pragma once

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/exec/fragment_plan.h"
#include "engine/exec/streaming_executor.h"
#include "engine/model/model_config.h"
#include "engine/model/parameter_layout.h"
#include "engine/exec/executor_geometry.h"

namespace megatrain::engine::planner {

using ::megatrain::engine::ExecutorGeometry;

// engine::MakeExecutorGeometry, with the options' checkpoint interval checked.
absl::StatusOr<ExecutorGeometry> MakeExecutorGeometry(const ModelConfig& config,
                                                      const ParameterLayout& layout,
                                                      int micro_batch, int seq, int head_chunk,
                                                      const ExecutorOptions& options,
                                                      int head_block_rows = 0);

// StreamingExecutor::PlanDeviceMemory for these entry sizes.
DeviceMemoryPlan DeviceMemoryPlanFor(const ExecutorGeometry& g, const ExecutorOptions& options,
                                     int weight_slots, DeviceKind kind);

// StreamingExecutor::ChooseDeviceCheckpoints within an arena of `arena_bytes`.
int DeviceCheckpointsFor(const ExecutorGeometry& g, const ExecutorOptions& options,
                         size_t arena_bytes, DeviceKind kind);

// StreamingExecutor::ChooseWeightSlots within an arena of `arena_bytes`.
int WeightSlotsFor(const ExecutorGeometry& g, const ExecutorOptions& options, size_t arena_bytes,
                   DeviceKind kind);

// Fragment mode (options.weight_ring_bytes > 0): the fragment plan Create builds for the step
// schedule of these options; a ring Create would refuse (too small for a tensor or a part's
// unit) fails here with Create's message, the evaluation schedule's plan checked too.
absl::StatusOr<FragmentPlan> StepFragmentPlanFor(const ExecutorGeometry& g,
                                                 const ExecutorOptions& options, DeviceKind kind);

// StreamingExecutor::StageFloats.
size_t StageFloats(const ExecutorGeometry& g, const std::vector<int>& entries);

}  // namespace megatrain::engine::planner
