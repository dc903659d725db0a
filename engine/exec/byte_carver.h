// ByteCarver: lays out a set of device buffers in one block: consecutive pieces, each rounded
// up to the set's alignment, in a fixed order. With a null base it only counts, so one carving
// function gives both a set's size and its pointers, on either backend.
#pragma once

#include <cstddef>
#include <cstdint>

namespace megatrain::engine {

class ByteCarver {
 public:
  // `alignment`: bytes, a power of two; pieces start at multiples of it from `base`.
  ByteCarver(void* base, size_t alignment) : base_(static_cast<char*>(base)), align_(alignment) {}

  template <class T>
  T* Take(int64_t count) {
    T* p = base_ != nullptr ? reinterpret_cast<T*>(base_ + used_) : nullptr;
    used_ += (sizeof(T) * static_cast<size_t>(count) + align_ - 1) / align_ * align_;
    return p;
  }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t align_;
  size_t used_ = 0;
};

// Bytes between the pieces of a set whose elements are T: each backend specialises it for its
// element type (fp32 on the CPU device: 64, a cache line; bf16 on a GPU: cuBLASLt's 256).
template <typename T>
struct CarveAlignment;

template <>
struct CarveAlignment<float> {
  static constexpr size_t kBytes = 64;
};

}  // namespace megatrain::engine
