// DeviceArena and the DeviceBuffer handle's release path.
#include "engine/device/device_arena.h"

#include <cstdint>
#include <cstdio>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/fatal.h"

namespace megatrain::engine {

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : arena_(std::exchange(other.arena_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      offset_(std::exchange(other.offset_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    arena_ = std::exchange(other.arena_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    offset_ = std::exchange(other.offset_, 0);
  }
  return *this;
}

void DeviceBuffer::Reset() {
  if (arena_ != nullptr) arena_->Release(offset_);
  arena_ = nullptr;
  data_ = nullptr;
  size_ = 0;
  offset_ = 0;
}

DeviceArena::DeviceArena(void* base, size_t capacity, std::string device_name)
    : base_(static_cast<char*>(base)),
      capacity_(capacity),
      device_name_(std::move(device_name)),
      allocator_(capacity) {
  if (reinterpret_cast<uintptr_t>(base) % ArenaAllocator::kAlignment != 0) {
    internal::DieBecause("DeviceArena: base address is not 256-byte aligned");
  }
}

DeviceArena::~DeviceArena() {
  const std::vector<ArenaBlock> leaked = allocator_.LiveBlocks();
  if (leaked.empty()) return;
  std::string message = absl::StrCat("device '", device_name_, "' destroyed with ", leaked.size(),
                                     " live DeviceBuffer(s):");
  for (const ArenaBlock& block : leaked) {
    absl::StrAppend(&message, " '", block.tag, "' (", block.size, " bytes)");
  }
#ifndef NDEBUG
  internal::DieBecause(message);
#else
  std::fprintf(stderr, "megatrain warning: %s\n", message.c_str());
#endif
}

absl::StatusOr<DeviceBuffer> DeviceArena::Allocate(size_t bytes, std::string_view tag) {
  if (bytes == 0) return DeviceBuffer();
  absl::StatusOr<size_t> offset = allocator_.Allocate(bytes, tag);
  if (!offset.ok()) {
    return absl::Status(offset.status().code(),
                        absl::StrCat("device '", device_name_, "': ", offset.status().message()));
  }
  return DeviceBuffer(this, base_ + *offset, bytes, *offset);
}

bool DeviceArena::Contains(const void* data, size_t bytes) const {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(base_);
  const uintptr_t p = reinterpret_cast<uintptr_t>(data);
  return p >= begin && bytes <= capacity_ && p - begin <= capacity_ - bytes;
}

}  // namespace megatrain::engine
