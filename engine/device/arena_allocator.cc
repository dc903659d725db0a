// ArenaAllocator: best-fit placement over two indexes of the free ranges, coalescing on free.
#include "engine/device/arena_allocator.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/fatal.h"

namespace megatrain::engine {
namespace {

size_t RoundUp(size_t bytes, size_t alignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}

}  // namespace

ArenaAllocator::ArenaAllocator(size_t capacity) : capacity_(capacity) {
  if (capacity_ > 0) InsertFree(0, capacity_);
}

void ArenaAllocator::InsertFree(size_t offset, size_t size) {
  free_by_offset_.emplace(offset, size);
  free_by_size_.emplace(size, offset);
}

void ArenaAllocator::EraseFree(std::map<size_t, size_t>::iterator it) {
  free_by_size_.erase({it->second, it->first});
  free_by_offset_.erase(it);
}

size_t ArenaAllocator::LargestFreeLocked() const {
  return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
}

absl::StatusOr<size_t> ArenaAllocator::Allocate(size_t bytes, std::string_view tag) {
  if (bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("arena allocation '", std::string(tag), "': bytes must be > 0, got 0"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  const size_t needed = RoundUp(bytes, kAlignment);
  // The range that ends at the capacity is the only one that may be shorter than `needed` and
  // still fit; when it does, it is also the smallest range that fits.
  std::map<size_t, size_t>::iterator chosen = free_by_offset_.end();
  if (!free_by_offset_.empty()) {
    auto last = std::prev(free_by_offset_.end());
    if (last->first + last->second == capacity_ && last->second >= bytes && last->second < needed) {
      chosen = last;
    }
  }
  if (chosen == free_by_offset_.end()) {
    auto best = free_by_size_.lower_bound({needed, 0});
    if (best != free_by_size_.end()) chosen = free_by_offset_.find(best->second);
  }
  if (chosen == free_by_offset_.end()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("device arena out of memory: requested ", bytes, " bytes for '",
                     std::string(tag), "' (", needed, " with 256-byte alignment); capacity ",
                     capacity_, " bytes, in use ", in_use_, " bytes, largest free block ",
                     LargestFreeLocked(), " bytes, ", live_.size(), " live allocations"));
  }
  const size_t offset = chosen->first;
  const size_t range = chosen->second;
  const size_t footprint = std::min(needed, range);
  EraseFree(chosen);
  if (range > footprint) InsertFree(offset + footprint, range - footprint);
  live_.emplace(offset, LiveBlock{footprint, std::string(tag)});
  in_use_ += footprint;
  peak_ = std::max(peak_, in_use_);
  ++total_allocations_;
  return offset;
}

void ArenaAllocator::Free(size_t offset) {
  std::lock_guard<std::mutex> lock(mu_);
  auto live = live_.find(offset);
  if (live == live_.end()) {
    internal::DieBecause(absl::StrCat("ArenaAllocator::Free: offset ", offset,
                                      " is not a live block (double free?)"));
  }
  size_t begin = offset;
  size_t size = live->second.size;
  in_use_ -= size;
  live_.erase(live);

  auto next = free_by_offset_.lower_bound(begin);
  if (next != free_by_offset_.end() && next->first == begin + size) {
    size += next->second;
    EraseFree(next);
  }
  auto after = free_by_offset_.lower_bound(begin);
  if (after != free_by_offset_.begin()) {
    auto prev = std::prev(after);
    if (prev->first + prev->second == begin) {
      begin = prev->first;
      size += prev->second;
      EraseFree(prev);
    }
  }
  InsertFree(begin, size);
}

ArenaStats ArenaAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ArenaStats stats;
  stats.capacity = capacity_;
  stats.in_use = in_use_;
  stats.peak = peak_;
  stats.allocations = live_.size();
  stats.total_allocations = total_allocations_;
  stats.largest_free_block = LargestFreeLocked();
  return stats;
}

void ArenaAllocator::ResetPeak() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_ = in_use_;
}

std::vector<ArenaBlock> ArenaAllocator::LiveBlocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ArenaBlock> blocks;
  blocks.reserve(live_.size());
  for (const auto& [offset, block] : live_) blocks.push_back({offset, block.size, block.tag});
  return blocks;
}

}  // namespace megatrain::engine
