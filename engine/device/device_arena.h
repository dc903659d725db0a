// DeviceArena: the fixed-capacity device memory of one device, handing out DeviceBuffers.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/device/arena_allocator.h"
#include "engine/device/device_buffer.h"

namespace megatrain::engine {

// Wraps memory the device reserved once (host memory on the CPU device, one cudaMalloc on CUDA);
// does not own it. `base` must be 256-byte aligned. Allocation beyond the capacity is an error,
// never a fallback. Not movable: live buffers point at it.
class DeviceArena {
 public:
  DeviceArena(void* base, size_t capacity, std::string device_name);
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  // Debug builds abort when buffers are still alive (they would dangle); release builds warn.
  ~DeviceArena();

  // A 0-byte request yields an empty buffer and touches nothing.
  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes, std::string_view tag);

  ArenaStats stats() const { return allocator_.stats(); }
  void ResetPeak() { allocator_.ResetPeak(); }

  // Whether [data, data + bytes) lies inside the arena.
  bool Contains(const void* data, size_t bytes) const;

 private:
  friend class DeviceBuffer;
  void Release(size_t offset) { allocator_.Free(offset); }

  char* const base_;
  const size_t capacity_;
  const std::string device_name_;
  ArenaAllocator allocator_;
};

}  // namespace megatrain::engine
