// GradientReduction: where the devices' gradients of a step meet (TrainerOptions::
// gradient_reduction; docs/scale_out.md "Reduce-scatter on the devices" and "Reduce-scatter
// across ranks"), the rule that chooses it for a run, and the DeviceReduction that carries it out
// among one process's devices or among ranks of one device each.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/device/device.h"
#include "engine/dist/communicator.h"
#include "engine/exec/device_reduction.h"
#include "engine/exec/streaming_executor.h"

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
// The reduction among `devices` (all of one kind): NCCL among CUDA devices (each collective
// bounded by `collective_timeout`: NcclOptions), rank order among CPU devices.
absl::StatusOr<std::unique_ptr<DeviceReduction>> MakeDeviceReduction(
    const std::vector<Device*>& devices, absl::Duration collective_timeout);
// The reduction among the ranks of `comm`, one `device` each: rank order over the communicator
// for the CPU device, NCCL over it for a GPU (NcclDeviceReduction::CreateOverHost, a collective:
// every rank calls it). INVALID_ARGUMENT naming the field for ZeRO-1 (each range's owner needs
// the whole of it, not one shard per rank).
absl::StatusOr<std::unique_ptr<DeviceReduction>> MakeRankReduction(
    Device& device, dist::Communicator& comm, bool zero1, absl::Duration collective_timeout);

}  // namespace megatrain::engine
