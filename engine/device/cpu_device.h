// CpuDevice: an emulated GPU: a hard-capacity arena in host memory, one worker thread per stream,
// real memcpys optionally throttled to an emulated full-duplex link.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/device/cpu_device_state.h"
#include "engine/device/cpu_pinned_pool.h"
#include "engine/device/device.h"
#include "engine/device/device_arena.h"

namespace megatrain::engine {

class CpuDevice final : public Device {
 public:
  // Validates `options` (kind must be kCpu) and reserves arena_bytes of host memory at once.
  static absl::StatusOr<std::unique_ptr<CpuDevice>> Create(const DeviceOptions& options);

  std::string_view name() const override;
  DeviceKind kind() const override { return DeviceKind::kCpu; }
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream(std::string name) override;
  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override;
  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes, std::string_view tag) override;
  ArenaStats arena_stats() const override { return arena_.stats(); }
  void ResetPeak() override { arena_.ResetPeak(); }
  absl::StatusOr<PinnedHostBuffer> AllocatePinned(size_t bytes) override;
  PinnedStats pinned_stats() const override { return pinned_.stats(); }
  absl::Status health() const override { return state_->fault(); }
  Timeline& timeline() override { return state_->timeline(); }

  // Test hook: a device fault. From now on the device is unhealthy (INTERNAL "device fault:
  // <reason>"), data operations not yet started on any stream are skipped, and Synchronize()
  // on every stream returns the fault.
  void InjectFault(std::string reason);

  // Sets the emulated bandwidth of both link directions (GB/s, 0 = unthrottled) for copies
  // that start from now on; INVALID_ARGUMENT when negative or not finite.
  absl::Status SetLinkGbps(double gbps);

  // Whether pinned memory degraded to pageable memory because mlock failed.
  bool pinned_mlock_degraded() const { return pinned_.mlock_degraded(); }

 private:
  CpuDevice(const DeviceOptions& options, std::shared_ptr<CpuDeviceState> state);

  const std::shared_ptr<CpuDeviceState> state_;  // owns the arena memory; outlives arena_
  DeviceArena arena_;
  CpuPinnedPool pinned_;
};

}  // namespace megatrain::engine
