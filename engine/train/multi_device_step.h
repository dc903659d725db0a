// Several devices of one process training one job (docs/scale_out.md "Several
// devices in one process"): micro-batch m of a step runs on device m % N, each
// device running its micro-batches in order on a thread of its own, every
// executor sharing the trainer's one ParameterStore, UpdateGate and rope
// table. GradientTurns make the host slabs receive the contributions in
// micro-batch order, so N devices give bitwise the results of one device with
// the same accumulation.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/device/device.h"
#include "engine/exec/device_reduction.h"
#include "engine/exec/gradient_turns.h"
#include "engine/exec/parameter_store.h"
#include "engine/exec/streaming_executor.h"
#include "engine/train/gradient_reduction.h"
#include "engine/train/step_report.h"

namespace megatrain::engine {

// One device and the executor that streams the model through it.
struct DeviceLane {
  Device* device = nullptr;
  StreamingExecutor* executor = nullptr;
};

// What a step's micro-batches need besides their tokens.
struct MicroBatchStepArgs {
  float inv_total_valid = 0;
  uint64_t weights_version = 0;
  // Optional: given to the step's last micro-batch as its executor's on_gradient_final
  // (streaming_executor.h); its turns come last, so each call means the entry is final.
  std::function<void(int entry)> on_last_gradient_final;
  // GradientReduction::kDevices: the executors' reduction, Reset at the start of the step and
  // aborted when a micro-batch fails. Every lane's last micro-batch then reports its entries
  // final, and on_last_gradient_final is called once all of them have.
  DeviceReduction* reduction = nullptr;
  // kDeviceShards: every device joins every micro-batch's reduce-scatters, so each must run the
  // same number of micro-batches.
  bool reduce_every_micro_batch = false;
};

struct MicroBatchesResult {
  double loss_sum = 0;  // summed in micro-batch order
  // Micro-batches each lane ran.
  std::vector<int> micro_batches_per_lane;
};

// Runs forward and backward of every micro-batch, micro-batch m on lanes[m %
// lanes.size()]. One lane runs on the calling thread without turns (the
// executor's stream order alone fixes the sums); several take turns through
// `turns` (Reset here). A failed micro-batch aborts the turns so no lane waits
// for it; the error of the first failed micro-batch is returned once every
// lane has stopped.
absl::StatusOr<MicroBatchesResult> RunMicroBatchesOnLanes(
    const std::vector<DeviceLane>& lanes, GradientTurns& turns,
    const std::vector<const int32_t*>& inputs, const std::vector<const int32_t*>& targets,
    const std::vector<TokenLayout>& layouts, const MicroBatchStepArgs& args);

// The devices a trainer is created with: at least one, none null, all of one
// kind. INVALID_ARGUMENT naming `devices`. Several devices and a communicator
// go together: the devices' gradients meet in this process's slabs first (one
// rank per node, each driving its node's devices), then the ranks reduce those.
absl::Status CheckTrainerDevices(const std::vector<Device*>& devices);
// Several devices read the compute copy from RAM: its NVMe tier (whose
// read-ahead follows one executor's order) is refused naming the field.
// Gradients may be on NVMe: their turns order the chunks as they order slabs.
absl::Status CheckMultiDevicePlacement(int devices, const StorePlacement& placement);

// The label of the executor's turn-wait span (a kWait host task on copy_out).
inline constexpr char kGradientTurnWaitLabel[] = "gradient turn";

// A device's figures of the step from its timeline spans: compute stalls,
// copy-in and compute time, and the time its gradient turns waited.
DeviceStepFigures DeviceFiguresFromSpans(const std::vector<TimelineSpan>& spans);

}  // namespace megatrain::engine
