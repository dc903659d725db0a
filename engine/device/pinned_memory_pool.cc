// PinnedMemoryPool budget accounting and the PinnedHostBuffer release path.
#include "engine/device/pinned_memory_pool.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/fatal.h"

namespace megatrain::engine {

PinnedHostBuffer::PinnedHostBuffer(PinnedHostBuffer&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

PinnedHostBuffer& PinnedHostBuffer::operator=(PinnedHostBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    pool_ = std::exchange(other.pool_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void PinnedHostBuffer::Reset() {
  if (pool_ != nullptr) pool_->Release(data_, size_);
  pool_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

absl::StatusOr<PinnedHostBuffer> PinnedMemoryPool::Allocate(size_t bytes) {
  if (bytes == 0) return PinnedHostBuffer();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes > budget_ - in_use_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("pinned host memory budget exceeded: requested ", bytes, " bytes; budget ",
                       budget_, " bytes (pinned_budget_bytes), in use ", in_use_, " bytes in ",
                       allocations_, " buffers"));
    }
    in_use_ += bytes;
    peak_ = std::max(peak_, in_use_);
    ++allocations_;
  }
  absl::StatusOr<void*> data = AllocateRaw(bytes);
  if (!data.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    in_use_ -= bytes;
    --allocations_;
    return data.status();
  }
  return PinnedHostBuffer(this, *data, bytes);
}

void PinnedMemoryPool::Release(void* data, size_t bytes) {
  FreeRaw(data, bytes);
  std::lock_guard<std::mutex> lock(mu_);
  in_use_ -= bytes;
  --allocations_;
}

PinnedStats PinnedMemoryPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return PinnedStats{budget_, in_use_, peak_, allocations_};
}

void PinnedMemoryPool::CheckNoLiveBuffers() const {
  const PinnedStats now = stats();
  if (now.allocations == 0) return;
  const std::string message =
      absl::StrCat("pinned memory pool destroyed with ", now.allocations,
                   " live PinnedHostBuffer(s) holding ", now.in_use, " bytes");
#ifndef NDEBUG
  internal::DieBecause(message);
#else
  std::fprintf(stderr, "megatrain warning: %s\n", message.c_str());
#endif
}

}  // namespace megatrain::engine
