// The planner's executor geometry: thin wrappers over the executor's own plan.
#include "engine/planner/executor_geometry.h"

#include "absl/strings/str_cat.h"

namespace megatrain::engine::planner {

absl::StatusOr<ExecutorGeometry> MakeExecutorGeometry(const ModelConfig& config,
                                                      const ParameterLayout& layout,
                                                      int micro_batch, int seq, int head_chunk,
                                                      const ExecutorOptions& options,
                                                      int head_block_rows) {
  if (options.checkpoint_interval < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint_interval=", options.checkpoint_interval, " must be >= 1"));
  }
  return engine::MakeExecutorGeometry(config, layout, micro_batch, seq, head_chunk,
                                      head_block_rows);
}

DeviceMemoryPlan DeviceMemoryPlanFor(const ExecutorGeometry& g, const ExecutorOptions& options,
                                     int weight_slots, DeviceKind kind) {
  return StreamingExecutor::PlanDeviceMemory(g.dims, g.layout, g.entry_elements, options,
                                             weight_slots, kind);
}

int DeviceCheckpointsFor(const ExecutorGeometry& g, const ExecutorOptions& options,
                         size_t arena_bytes, DeviceKind kind) {
  return StreamingExecutor::ChooseDeviceCheckpoints(g.dims, g.layout, g.entry_elements, options,
                                                    arena_bytes, kind);
}

int WeightSlotsFor(const ExecutorGeometry& g, const ExecutorOptions& options, size_t arena_bytes,
                   DeviceKind kind) {
  return StreamingExecutor::ChooseWeightSlots(g.dims, g.layout, g.entry_elements, options,
                                              arena_bytes, kind);
}

absl::StatusOr<FragmentPlan> StepFragmentPlanFor(const ExecutorGeometry& g,
                                                 const ExecutorOptions& options, DeviceKind kind) {
  ScheduleShape shape = g.layout.schedule;
  shape.checkpoint_interval = options.checkpoint_interval;
  shape.keep_all = options.keep_all;
  shape.block_modes = options.block_modes;
  FragmentPlanInputs in;
  in.dims = g.dims;
  in.offsets = g.layout.layer_offsets;
  in.entry_elements = g.entry_elements;
  in.element_bytes = StreamingExecutor::SizesFor(kind, g.dims).weight_element_bytes;
  in.ring_bytes = options.weight_ring_bytes;
  in.fragment_bytes = options.fragment_bytes > 0 ? options.fragment_bytes : kDefaultFragmentBytes;
  absl::StatusOr<FragmentPlan> step = PlanFragments(BuildStepSchedule(shape), in);
  if (!step.ok()) return step.status();
  if (absl::StatusOr<FragmentPlan> eval = PlanFragments(BuildEvalSchedule(shape), in); !eval.ok()) {
    return eval.status();
  }
  return step;
}

size_t StageFloats(const ExecutorGeometry& g, const std::vector<int>& entries) {
  return StreamingExecutor::StageFloats(g.entry_elements, entries);
}

}  // namespace megatrain::engine::planner
