// CreateDevice: dispatch on DeviceOptions::kind.
#include "engine/device/device_factory.h"

#include "engine/device/cpu_device.h"
#include "engine/device/cuda_device.h"

namespace megatrain::engine {

absl::StatusOr<std::unique_ptr<Device>> CreateDevice(const DeviceOptions& options) {
  if (options.kind == DeviceKind::kCuda) return CreateCudaDevice(options);
  absl::StatusOr<std::unique_ptr<CpuDevice>> device = CpuDevice::Create(options);
  if (!device.ok()) return device.status();
  return std::unique_ptr<Device>(std::move(*device));
}

}  // namespace megatrain::engine
