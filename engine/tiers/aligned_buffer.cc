// AlignedBuffer: aligned allocation and release.
#include "engine/tiers/aligned_buffer.h"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace megatrain::engine::tiers {

absl::StatusOr<AlignedBuffer> AlignedBuffer::Allocate(size_t bytes) {
  if (bytes == 0) return AlignedBuffer();
  const size_t size = RoundUpToBlock(bytes);
  void* p = std::aligned_alloc(kDirectIoAlignment, size);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", size, " bytes of aligned host memory for I/O staging"));
  }
  std::memset(p, 0, size);
  return AlignedBuffer(p, size);
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void AlignedBuffer::Reset() {
  std::free(data_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace megatrain::engine::tiers
