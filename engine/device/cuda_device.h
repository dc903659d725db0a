// CudaDevice: the Device on a GPU: one cudaMalloc'd arena carved by ArenaAllocator, cudaHostAlloc
// pinned memory, non-blocking streams, sync-only events.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/device/cuda_device_state.h"
#include "engine/device/device.h"
#include "engine/device/device_arena.h"
#include "engine/device/pinned_memory_pool.h"

namespace megatrain::engine {

// Pinned memory from cudaHostAlloc (portable across devices).
class CudaPinnedPool final : public PinnedMemoryPool {
 public:
  CudaPinnedPool(size_t budget_bytes, std::shared_ptr<CudaDeviceState> device);
  ~CudaPinnedPool() override;

 protected:
  absl::StatusOr<void*> AllocateRaw(size_t bytes) override;
  void FreeRaw(void* data, size_t bytes) override;

 private:
  const std::shared_ptr<CudaDeviceState> device_;
};

class CudaDevice final : public Device {
 public:
  // FAILED_PRECONDITION "no CUDA device: <cuda error string>" when the runtime finds no usable
  // GPU; INVALID_ARGUMENT for bad options; RESOURCE_EXHAUSTED if the arena cannot be reserved.
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(const DeviceOptions& options);
  ~CudaDevice() override;

  std::string_view name() const override { return state_->name(); }
  DeviceKind kind() const override { return DeviceKind::kCuda; }
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream(std::string name) override;
  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override;
  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes, std::string_view tag) override;
  ArenaStats arena_stats() const override { return arena_->stats(); }
  void ResetPeak() override { arena_->ResetPeak(); }
  absl::StatusOr<PinnedHostBuffer> AllocatePinned(size_t bytes) override;
  PinnedStats pinned_stats() const override { return pinned_.stats(); }
  absl::Status health() const override { return state_->fault(); }
  Timeline& timeline() override { return state_->timeline(); }
  absl::Status MakeCurrent() override { return state_->MakeCurrent(); }

  int ordinal() const { return state_->ordinal(); }
  // OK when host waits block (DeviceOptions::cuda_blocking_sync); else why they may spin.
  const absl::Status& blocking_sync_status() const { return blocking_sync_status_; }

 private:
  CudaDevice(const DeviceOptions& options, std::shared_ptr<CudaDeviceState> state,
             void* arena_memory);

  const std::shared_ptr<CudaDeviceState> state_;
  void* const arena_memory_;            // cudaFree'd after arena_ checked for live buffers
  std::unique_ptr<DeviceArena> arena_;  // reset first in the destructor
  CudaPinnedPool pinned_;
  const bool host_task_threads_;  // DeviceOptions::cuda_host_task_threads
  absl::Status blocking_sync_status_;
};

// The GPUs this process sees (CUDA_VISIBLE_DEVICES applied): FAILED_PRECONDITION "no CUDA
// device: ..." when there are none or the driver cannot say.
absl::StatusOr<int> CountCudaDevices();
// The GPU's UUID as nvidia-smi prints it ("GPU-xxxxxxxx-xxxx-..."): unique across machines.
absl::StatusOr<std::string> CudaDeviceUuid(int ordinal);

// CudaDevice::Create behind the Device interface.
absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(const DeviceOptions& options);

}  // namespace megatrain::engine
