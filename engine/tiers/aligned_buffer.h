// AlignedBuffer: move-only, zero-filled host memory aligned for O_DIRECT I/O.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"

namespace megatrain::engine::tiers {

// The alignment and size granularity of every O_DIRECT transfer: offsets, lengths and buffer
// addresses are multiples of it. 4 KiB covers every logical block size in use (512 B and 4 KiB).
inline constexpr size_t kDirectIoAlignment = 4096;

inline constexpr uint64_t RoundUpToBlock(uint64_t bytes) {
  return (bytes + kDirectIoAlignment - 1) / kDirectIoAlignment * kDirectIoAlignment;
}

// Pageable memory; its size is rounded up to kDirectIoAlignment so whole blocks can be transferred.
class AlignedBuffer {
 public:
  // RESOURCE_EXHAUSTED (naming the size) when the allocation fails.
  static absl::StatusOr<AlignedBuffer> Allocate(size_t bytes);

  AlignedBuffer() = default;
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { Reset(); }

  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  size_t size() const { return size_; }  // a multiple of kDirectIoAlignment
  bool empty() const { return data_ == nullptr; }
  void Reset();

 private:
  AlignedBuffer(void* data, size_t size) : data_(data), size_(size) {}
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace megatrain::engine::tiers
