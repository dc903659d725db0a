// The gradient reduction's rule and the reductions it makes (see gradient_reduction.h).
#include "engine/train/gradient_reduction.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/dist/communicator_device_reduction.h"
#include "engine/dist/nccl_device_reduction.h"
#include "engine/exec/cpu_device_reduction.h"

namespace megatrain::engine {

std::string_view GradientReductionName(GradientReduction r) {
  switch (r) {
    case GradientReduction::kHost:
      return "host";
    case GradientReduction::kDevices:
      return "devices";
    case GradientReduction::kDeviceShards:
      return "device_shards";
    case GradientReduction::kAuto:
      return "auto";
  }
  return "?";
}

absl::StatusOr<GradientReduction> ParseGradientReduction(std::string_view name) {
  for (GradientReduction r : {GradientReduction::kHost, GradientReduction::kDevices,
                              GradientReduction::kDeviceShards, GradientReduction::kAuto}) {
    if (name == GradientReductionName(r)) return r;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("gradient_reduction=\"", std::string(name),
                   "\": must be host, devices, device_shards or auto"));
}

absl::StatusOr<GradientReduction> ReduceOnDevices(const GradientReductionInputs& in) {
  if (in.devices <= 1 || in.asked == GradientReduction::kHost) return GradientReduction::kHost;
  if (in.asked == GradientReduction::kAuto) {
    if (in.kind != DeviceKind::kCuda || in.accumulation == GradientAccumulation::kHost ||
        in.tied_embeddings || in.grad_on_nvme) {
      return GradientReduction::kHost;
    }
    if (in.sums_fit) return GradientReduction::kDevices;
    if (in.shard_sums_fit && !in.weight_ring) return GradientReduction::kDeviceShards;
    return GradientReduction::kHost;
  }
  const std::string asked(GradientReductionName(in.asked));
  const auto refuse = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient_reduction=", asked,
                     in.across_ranks ? absl::StrCat(" across ", in.devices, " ranks")
                                     : absl::StrCat(" with devices=", in.devices),
                     ": ", std::string(why)));
  };
  if (in.accumulation == GradientAccumulation::kHost) {
    return refuse("it sums each device's micro-batches on the device, but gradient_accumulation="
                  "host keeps them off it");
  }
  if (in.tied_embeddings) {
    return refuse("the model ties its embedding (tie_word_embeddings), whose gradient is summed "
                  "on the host in micro-batch order; use host or auto");
  }
  if (in.grad_on_nvme) {
    return refuse("memory.grad_on_nvme puts the gradients on NVMe, whose chunks take whole "
                  "contributions in turns; keep them in RAM or use host");
  }
  if (in.asked == GradientReduction::kDeviceShards && in.weight_ring) {
    return refuse("the weight ring (executor.weight_ring_bytes) sends the LM head's gradient in "
                  "blocks, and device_shards reduce-scatters whole entries; use devices");
  }
  return in.asked;
}

namespace {

dist::NcclOptions NcclOptionsWith(absl::Duration collective_timeout) {
  dist::NcclOptions options;
  options.collective_timeout = collective_timeout;
  return options;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceReduction>> MakeRankReduction(
    Device& device, dist::Communicator& comm, bool zero1, absl::Duration collective_timeout) {
  const std::string where = absl::StrCat("gradient_reduction across ", comm.size(), " ranks");
  if (zero1) {
    return absl::InvalidArgumentError(
        absl::StrCat(where,
                     " with zero1: each range's owner needs its whole reduced gradient, and the "
                     "reduce-scatter leaves one shard per rank; use gradient_reduction=host"));
  }
  if (device.kind() == DeviceKind::kCuda) {
    // NCCL's world over the job's communicator, one GPU per process (written, not yet run).
    absl::StatusOr<std::unique_ptr<dist::NcclDeviceReduction>> nccl =
        dist::NcclDeviceReduction::CreateOverHost(comm, device,
                                                  NcclOptionsWith(collective_timeout));
    if (!nccl.ok()) return nccl.status();
    return std::unique_ptr<DeviceReduction>(std::move(*nccl));
  }
  return std::unique_ptr<DeviceReduction>(
      std::make_unique<dist::CommunicatorDeviceReduction>(comm));
}

absl::StatusOr<std::unique_ptr<DeviceReduction>> MakeDeviceReduction(
    const std::vector<Device*>& devices, absl::Duration collective_timeout) {
  if (!devices.empty() && devices[0]->kind() == DeviceKind::kCuda) {
    absl::StatusOr<std::unique_ptr<dist::NcclDeviceReduction>> nccl =
        dist::NcclDeviceReduction::Create(devices, NcclOptionsWith(collective_timeout));
    if (!nccl.ok()) return nccl.status();
    return std::unique_ptr<DeviceReduction>(std::move(*nccl));
  }
  return std::make_unique<CpuDeviceReduction>(static_cast<int>(devices.size()));
}

}  // namespace megatrain::engine
