// PinnedMemoryPool: budget accounting for pinned host memory; devices supply the raw allocator.
#pragma once

#include <cstddef>
#include <mutex>

#include "absl/status/statusor.h"
#include "engine/device/pinned_host_buffer.h"

namespace megatrain::engine {

struct PinnedStats {
  size_t budget = 0;       // bytes allowed (DeviceOptions::pinned_budget_bytes)
  size_t in_use = 0;       // bytes requested by live buffers
  size_t peak = 0;         // high-water mark of in_use
  size_t allocations = 0;  // live buffers
};

// Thread-safe. Counts requested bytes against the budget whatever the raw allocator rounds to.
class PinnedMemoryPool {
 public:
  explicit PinnedMemoryPool(size_t budget_bytes) : budget_(budget_bytes) {}
  PinnedMemoryPool(const PinnedMemoryPool&) = delete;
  PinnedMemoryPool& operator=(const PinnedMemoryPool&) = delete;
  // Derived destructors must call CheckNoLiveBuffers() first (buffers would dangle).
  virtual ~PinnedMemoryPool() = default;

  // RESOURCE_EXHAUSTED (with requested, budget, in use) when the budget would be exceeded.
  absl::StatusOr<PinnedHostBuffer> Allocate(size_t bytes);
  PinnedStats stats() const;

 protected:
  virtual absl::StatusOr<void*> AllocateRaw(size_t bytes) = 0;
  virtual void FreeRaw(void* data, size_t bytes) = 0;
  // Debug builds abort when buffers are alive; release builds warn.
  void CheckNoLiveBuffers() const;

 private:
  friend class PinnedHostBuffer;
  void Release(void* data, size_t bytes);

  const size_t budget_;
  mutable std::mutex mu_;
  size_t in_use_ = 0;
  size_t peak_ = 0;
  size_t allocations_ = 0;
};

}  // namespace megatrain::engine
