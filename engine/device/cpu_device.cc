// CpuDevice: creation (validation, arena reservation) and the Device methods.
#include "engine/device/cpu_device.h"

#include <cmath>
#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/device/cpu_event.h"
#include "engine/device/cpu_stream.h"

namespace megatrain::engine {

absl::StatusOr<std::unique_ptr<CpuDevice>> CpuDevice::Create(const DeviceOptions& options) {
  if (options.kind != DeviceKind::kCpu) {
    return absl::InvalidArgumentError(absl::StrCat("CpuDevice::Create: kind must be cpu, got ",
                                                   std::string(DeviceKindName(options.kind))));
  }
  if (absl::Status valid = ValidateDeviceOptions(options); !valid.ok()) return valid;
  const size_t alignment = ArenaAllocator::kAlignment;
  const size_t reserved = (options.arena_bytes + alignment - 1) / alignment * alignment;
  std::unique_ptr<char, FreeDeleter> memory(
      static_cast<char*>(std::aligned_alloc(alignment, reserved)));
  if (memory == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot reserve arena_bytes=", options.arena_bytes, " of host memory for the CPU device"));
  }
  auto state = std::make_shared<CpuDeviceState>("cpu", std::move(memory), options.arena_bytes,
                                                options.link_gbps, options.link_latency_us);
  state->timeline().set_enabled(options.record_timeline);
  return std::unique_ptr<CpuDevice>(new CpuDevice(options, std::move(state)));
}

CpuDevice::CpuDevice(const DeviceOptions& options, std::shared_ptr<CpuDeviceState> state)
    : state_(std::move(state)),
      arena_(state_->arena_base(), options.arena_bytes, state_->name()),
      pinned_(options.pinned_budget_bytes, state_->name()) {}

std::string_view CpuDevice::name() const { return state_->name(); }

absl::StatusOr<std::unique_ptr<Stream>> CpuDevice::CreateStream(std::string name) {
  if (name.empty()) return absl::InvalidArgumentError("stream name must be non-empty, got \"\"");
  return std::unique_ptr<Stream>(std::make_unique<CpuStream>(std::move(name), state_));
}

absl::StatusOr<std::unique_ptr<Event>> CpuDevice::CreateEvent() {
  return std::unique_ptr<Event>(std::make_unique<CpuEvent>(state_));
}

absl::StatusOr<DeviceBuffer> CpuDevice::Allocate(size_t bytes, std::string_view tag) {
  return arena_.Allocate(bytes, tag);
}

absl::StatusOr<PinnedHostBuffer> CpuDevice::AllocatePinned(size_t bytes) {
  return pinned_.Allocate(bytes);
}

absl::Status CpuDevice::SetLinkGbps(double gbps) {
  if (!(gbps >= 0) || !std::isfinite(gbps)) {
    return absl::InvalidArgumentError(absl::StrCat("link_gbps=", gbps, " must be finite and >= 0"));
  }
  state_->host_to_device().set_gbps(gbps);
  state_->device_to_host().set_gbps(gbps);
  return absl::OkStatus();
}

void CpuDevice::InjectFault(std::string reason) {
  state_->SetFault(absl::InternalError(absl::StrCat("device fault: ", reason)));
}

}  // namespace megatrain::engine
