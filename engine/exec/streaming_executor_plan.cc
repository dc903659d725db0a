// StreamingExecutor's static planning: device memory, pinned staging, weight
// slots, activation sets and ring sizes, known before any device exists.
#include "engine/exec/streaming_executor_impl.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/exec/cuda_stage_backend.h"
#include "engine/exec/stage_backend_factory.h"

namespace megatrain::engine {

using namespace executor_internal;  // NOLINT: the executor's own shapes

std::string DeviceMemoryPlan::Describe() const {
  return absl::StrFormat(
      "%d bytes = %s %d + gradient buffers %d + saved activations %d + "
      "checkpoints %d + scratch %d%s (%d checkpoints on the device, %d in pinned host memory)",
      total(), weight_ring ? "weight ring" : "weight slots", weight_slots, gradient_buffers,
      activations, checkpoints, scratch,
      gradient_sums > 0 ? absl::StrCat(" + gradient sums ", gradient_sums) : "",
      device_checkpoints, host_checkpoints);
}

std::string_view GradientAccumulationName(GradientAccumulation g) {
  switch (g) {
    case GradientAccumulation::kHost:
      return "host";
    case GradientAccumulation::kDevice:
      return "device";
    case GradientAccumulation::kAuto:
      return "auto";
  }
  return "?";
}

absl::StatusOr<GradientAccumulation> ParseGradientAccumulation(std::string_view name) {
  for (GradientAccumulation g : {GradientAccumulation::kHost, GradientAccumulation::kDevice,
                                 GradientAccumulation::kAuto}) {
    if (name == GradientAccumulationName(g)) return g;
  }
  return absl::InvalidArgumentError(absl::StrCat("gradient_accumulation=\"", std::string(name),
                                                 "\": must be host, device or auto"));
}

absl::StatusOr<GradientAccumulation> GradientAccumulationForRun(GradientAccumulation asked,
                                                                int micro_batches_per_device,
                                                                int devices_in_process) {
  if (devices_in_process > 1) {
    if (asked == GradientAccumulation::kDevice) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradient_accumulation=device sums one device's micro-batches; with devices=",
          devices_in_process,
          " their gradients meet on the host in micro-batch order: use host or auto"));
    }
    return GradientAccumulation::kHost;
  }
  if (asked == GradientAccumulation::kAuto && micro_batches_per_device <= 1) {
    return GradientAccumulation::kHost;
  }
  return asked;
}

GradientAccumulation StreamingExecutor::ResolveGradientAccumulation(
    const ModelDims& dims, const ExecutorLayout& layout, absl::Span<const size_t> entry_elements,
    const ExecutorOptions& options, size_t arena_capacity, DeviceKind kind) {
  if (options.gradient_accumulation != GradientAccumulation::kAuto) {
    return options.gradient_accumulation;
  }
  if (kind != DeviceKind::kCuda) return GradientAccumulation::kHost;
  // The minimum plan with the sums: two slots (or the ring), every auto checkpoint on the host.
  ExecutorOptions probe = options;
  probe.gradient_accumulation = GradientAccumulation::kDevice;
  // A checkpoint count the caller fixed stays; auto ones yield to the sums.
  probe.device_checkpoints = options.device_checkpoints >= 0 ? options.device_checkpoints : 0;
  const int slots = options.weight_slots > 0 ? options.weight_slots : 2;
  const size_t needed = PlanDeviceMemory(dims, layout, entry_elements, probe, slots, kind).total();
  // Leave 1/16 of the arena for allocator fragmentation, as the slot choice does.
  return needed + arena_capacity / 16 <= arena_capacity ? GradientAccumulation::kDevice
                                                        : GradientAccumulation::kHost;
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
  // A reduce-scatter of every micro-batch reads world shards of an entry from the gradient
  // buffer: up to world - 1 floats past its end.
  const size_t padding = options.device_reduction != nullptr && options.reduce_every_micro_batch
                             ? static_cast<size_t>(options.device_reduction->world())
                             : 0;
  plan.gradient_buffers = 2 * Round256((p.grad_floats + padding) * sizeof(float));
  const absl::StatusOr<int> sets = ActivationSetsFor(dims, given_layout, options, kind);
  plan.activations = (sets.ok() ? *sets : p.activation_sets) * Round256(sizes.activation_set_bytes);
  plan.checkpoints = p.device_checkpoints * x_bytes;
  plan.device_checkpoints = p.device_checkpoints;
  plan.host_checkpoints = p.checkpoints - p.device_checkpoints;
  plan.scratch = 4 * x_bytes + Round256(sizes.scratch_bytes) + 4 * Round256(n * sizeof(int32_t));
  if (p.device_checkpoints < p.checkpoints) plan.scratch += x_bytes;  // staging for host ones
  if (options.gradient_accumulation == GradientAccumulation::kDevice) {
    plan.gradient_sums = DeviceSumBytes(
        schedule, entry_elements,
        options.device_reduction != nullptr ? options.device_reduction->world() : 1,
        options.device_reduction != nullptr && options.reduce_every_micro_batch);
  }
  return plan;
}

StageSizes StreamingExecutor::SizesFor(DeviceKind kind, const ModelDims& dims) {
  return StageSizesFor(kind, dims);
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

int StreamingExecutor::ChooseDeviceCheckpoints(const ModelDims& dims,
                                               const ExecutorLayout& given_layout,
                                               absl::Span<const size_t> entry_elements,
                                               const ExecutorOptions& options,
                                               size_t arena_capacity, DeviceKind kind) {
  const ExecutorLayout layout = WithOptions(given_layout, options);
  const int count = CheckpointCount(layout.schedule);
  if (options.device_checkpoints >= 0) return std::min(options.device_checkpoints, count);
  // The minimum plan: two slots with auto slots (its extra slots come after
  // the checkpoints), the slots asked for otherwise, or the ring; and the gradient sums, which
  // come before checkpoints (a host checkpoint costs one activation's copy out and back, the
  // sums save a whole model's gradients per micro-batch).
  const int slots = options.weight_slots > 0 ? options.weight_slots : 2;
  ExecutorOptions probe = options;
  probe.gradient_accumulation = ResolveGradientAccumulation(
      dims, given_layout, entry_elements, options, arena_capacity, kind);
  probe.device_checkpoints = count;
  if (PlanDeviceMemory(dims, layout, entry_elements, probe, slots, kind).total() <=
      arena_capacity) {
    return count;
  }
  probe.device_checkpoints = 0;  // every one on the host: the staging buffer joins the plan
  const size_t base = PlanDeviceMemory(dims, layout, entry_elements, probe, slots, kind).total();
  if (base >= arena_capacity) return 0;
  const size_t x_bytes = Round256(ActivationBytes(dims, SizesFor(kind, dims)));
  // Fewer than count - 1: all but one would not fit without the staging buffer either.
  return std::min<int>(count, static_cast<int>((arena_capacity - base) / x_bytes));
}

int StreamingExecutor::ChooseWeightSlots(const ModelDims& dims, const ExecutorLayout& given_layout,
                                         absl::Span<const size_t> entry_elements,
                                         const ExecutorOptions& given_options,
                                         size_t arena_capacity, DeviceKind kind) {
  if (given_options.weight_ring_bytes > 0) return 0;
  if (given_options.weight_slots > 0) return given_options.weight_slots;
  ExecutorOptions options = given_options;
  options.gradient_accumulation = ResolveGradientAccumulation(
      dims, given_layout, entry_elements, given_options, arena_capacity, kind);
  options.device_checkpoints = ChooseDeviceCheckpoints(dims, given_layout, entry_elements,
                                                       given_options, arena_capacity, kind);
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

size_t StreamingExecutor::LayerRingBytes(const ModelDims& dims, const LayerOffsets& offsets,
                                         DeviceKind kind) {
  return engine::LayerRingBytes(dims, offsets, SizesFor(kind, dims).weight_element_bytes);
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

}  // namespace megatrain::engine
