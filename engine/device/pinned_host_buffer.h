// PinnedHostBuffer: move-only handle to page-locked host memory from a PinnedMemoryPool.
#pragma once

#include <cstddef>

namespace megatrain::engine {

class PinnedMemoryPool;

// Freed (and its bytes returned to the pinned budget) on destruction or Reset(). Must not
// outlive its device. Empty when default-constructed, moved-from, or a 0-byte allocation.
class PinnedHostBuffer {
 public:
  PinnedHostBuffer() = default;
  PinnedHostBuffer(PinnedHostBuffer&& other) noexcept;
  PinnedHostBuffer& operator=(PinnedHostBuffer&& other) noexcept;
  PinnedHostBuffer(const PinnedHostBuffer&) = delete;
  PinnedHostBuffer& operator=(const PinnedHostBuffer&) = delete;
  ~PinnedHostBuffer() { Reset(); }

  void* data() const { return data_; }  // at least 64-byte aligned
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  size_t size() const { return size_; }
  bool empty() const { return data_ == nullptr; }

  void Reset();

 private:
  friend class PinnedMemoryPool;
  PinnedHostBuffer(PinnedMemoryPool* pool, void* data, size_t size)
      : pool_(pool), data_(data), size_(size) {}

  PinnedMemoryPool* pool_ = nullptr;
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace megatrain::engine
