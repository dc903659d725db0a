// The planner's executor geometry: thin wrappers over the executor's own plan.
#include "engine/planner/executor_geometry.h"

#include "absl/strings/str_cat.h"

namespace megatrain::engine::planner {

absl::StatusOr<ExecutorGeometry> MakeExecutorGeometry(const ModelConfig& config,
                                                      const ParameterLayout& layout,
                                                      int micro_batch, int seq, int head_chunk,
                                                      const ExecutorOptions& options) {
  if (options.checkpoint_interval < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint_interval=", options.checkpoint_interval, " must be >= 1"));
  }
  return engine::MakeExecutorGeometry(config, layout, micro_batch, seq, head_chunk);
}

DeviceMemoryPlan DeviceMemoryPlanFor(const ExecutorGeometry& g, const ExecutorOptions& options,
                                     int weight_slots, DeviceKind kind) {
  return StreamingExecutor::PlanDeviceMemory(g.dims, g.layout, g.entry_elements, options,
                                             weight_slots, kind);
}

int WeightSlotsFor(const ExecutorGeometry& g, const ExecutorOptions& options, size_t arena_bytes,
                   DeviceKind kind) {
  return StreamingExecutor::ChooseWeightSlots(g.dims, g.layout, g.entry_elements, options,
                                              arena_bytes, kind);
}

size_t StageFloats(const ExecutorGeometry& g, const std::vector<int>& entries) {
  return StreamingExecutor::StageFloats(g.entry_elements, entries);
}

}  // namespace megatrain::engine::planner
