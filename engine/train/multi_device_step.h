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
#include "engine/dist/communicator.h"
#include "engine/exec/device_reduction.h"
#include "engine/exec/gradient_turns.h"
#include "engine/exec/parameter_store.h"
#include "engine/exec/streaming_executor.h"
#include "engine/train/step_report.h"

namespace megatrain::engine {

// How the devices of one process combine a step's gradients (TrainerOptions::gradient_reduction).
enum class GradientReduction {
  // Every device's contributions land in the host slabs in turns, in micro-batch order: bitwise
  // one device's accumulation, for any accumulation.
  kHost,
  // Each device sums its micro-batches on the device, a reduce-scatter among the devices sums
  // the devices' sums (DeviceReduction: NCCL on GPUs, rank order on the CPU device), and each
  // device copies out only its 1/N of every entry. Bitwise one device's accumulation on the CPU
  // device when every device runs one micro-batch a step; otherwise (and with NCCL) within fp32
  // rounding of it. Needs an untied embedding, gradients in RAM, the sums in each arena, and at
  // least one micro-batch per device.
  kDevices,
  // As kDevices, but every micro-batch's gradient is reduce-scattered as it leaves the backward
  // and each device keeps only the sum of its shard (4/N B of device memory per parameter, not
  // 4): for models whose whole sums do not fit, for N times the peer traffic. Needs the same
  // number of micro-batches on every device and whole-stage slots (no weight ring).
  kDeviceShards,
  // On CUDA devices: kDevices where the whole sums fit, else kDeviceShards where the shards fit
  // (and no weight ring), else kHost. kHost on the CPU device.
  kAuto,
};
std::string_view GradientReductionName(GradientReduction r);
// "host", "devices", "device_shards" or "auto"; anything else is INVALID_ARGUMENT naming the
// value.
absl::StatusOr<GradientReduction> ParseGradientReduction(std::string_view name);

// What the choice between them looks at.
struct GradientReductionInputs {
  GradientReduction asked = GradientReduction::kAuto;
  GradientAccumulation accumulation = GradientAccumulation::kAuto;  // as the job asks
  int devices = 1;            // the reduction's world: the devices, or the ranks
  bool across_ranks = false;  // one device per rank, reduce-scattering among the ranks
  DeviceKind kind = DeviceKind::kCpu;
  bool tied_embeddings = false;
  bool grad_on_nvme = false;
  bool weight_ring = false;      // executor.weight_ring_bytes > 0
  bool sums_fit = false;         // the whole sums beside the minimum plan (as auto accumulation)
  bool shard_sums_fit = false;   // this device's shards of them and the shard buffer
};
// kHost, kDevices or kDeviceShards for the run. INVALID_ARGUMENT naming the field when kDevices
// or kDeviceShards is asked for and cannot run.
absl::StatusOr<GradientReduction> ReduceOnDevices(const GradientReductionInputs& in);
// The reduction among `devices` (all of one kind): NCCL among CUDA devices, rank order among CPU
// devices.
absl::StatusOr<std::unique_ptr<DeviceReduction>> MakeDeviceReduction(
    const std::vector<Device*>& devices);
// The reduction among the ranks of `comm`, one `device` each: rank order over the communicator
// for the CPU device, NCCL over it for a GPU (NcclDeviceReduction::CreateOverHost, a collective:
// every rank calls it). INVALID_ARGUMENT naming the field for ZeRO-1 (each entry's owner needs
// the whole of it, not one shard per rank).
absl::StatusOr<std::unique_ptr<DeviceReduction>> MakeRankReduction(Device& device,
                                                                   dist::Communicator& comm,
                                                                   bool zero1);

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
