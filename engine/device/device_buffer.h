// DeviceBuffer: move-only handle to a block of device memory carved from a DeviceArena.
#pragma once

#include <cstddef>

namespace megatrain::engine {

class DeviceArena;

// Freed (returned to the arena) on destruction or Reset(). A DeviceBuffer must not outlive the
// device that allocated it; debug builds abort at device destruction if one does. An empty
// buffer (default-constructed, moved-from, or a 0-byte allocation) has data() == nullptr.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Reset(); }

  // Device address: dereferenceable on the CPU device only.
  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  size_t size() const { return size_; }  // bytes requested
  bool empty() const { return data_ == nullptr; }

  void Reset();

 private:
  friend class DeviceArena;
  DeviceBuffer(DeviceArena* arena, void* data, size_t size, size_t offset)
      : arena_(arena), data_(data), size_(size), offset_(offset) {}

  DeviceArena* arena_ = nullptr;
  void* data_ = nullptr;
  size_t size_ = 0;
  size_t offset_ = 0;
};

}  // namespace megatrain::engine
