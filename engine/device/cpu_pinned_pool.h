// CpuPinnedPool: "pinned" host memory on the CPU device: page-aligned memory with an mlock
// attempt that degrades to pageable memory with one warning.
#pragma once

#include <atomic>
#include <cstddef>
#include <string>

#include "engine/device/pinned_memory_pool.h"

namespace megatrain::engine {

class CpuPinnedPool final : public PinnedMemoryPool {
 public:
  CpuPinnedPool(size_t budget_bytes, std::string device_name);
  ~CpuPinnedPool() override;

  // Whether an mlock has failed (the warning was printed once).
  bool mlock_degraded() const { return mlock_degraded_.load(); }

 protected:
  absl::StatusOr<void*> AllocateRaw(size_t bytes) override;
  void FreeRaw(void* data, size_t bytes) override;

 private:
  const std::string device_name_;
  std::atomic<bool> mlock_degraded_{false};
};

}  // namespace megatrain::engine
