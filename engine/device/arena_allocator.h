// ArenaAllocator: carves a fixed range of byte offsets into 256-byte aligned blocks (best fit,
// coalescing frees). Works on offsets so the CPU arena and the cudaMalloc'd arena share it.
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace megatrain::engine {

struct ArenaStats {
  size_t capacity = 0;            // bytes the arena holds
  size_t in_use = 0;              // bytes held by live blocks (each rounded up to 256)
  size_t peak = 0;                // high-water mark of in_use since creation or ResetPeak()
  size_t allocations = 0;         // live blocks
  size_t total_allocations = 0;   // successful allocations since creation
  size_t largest_free_block = 0;  // bytes of the largest contiguous free range
};

// A live block as reported by LiveBlocks() (leak reports).
struct ArenaBlock {
  size_t offset = 0;
  size_t size = 0;  // footprint in bytes
  std::string tag;
};

// Thread-safe. Deterministic: the same sequence of calls yields the same offsets. Best fit picks
// the smallest free range that holds the request, the lowest offset among equals. Every block
// starts at a multiple of kAlignment; its footprint is the request rounded up to kAlignment,
// except that the range ending at the capacity may be taken whole (so an arena whose capacity is
// not a multiple of kAlignment can still be filled exactly).
class ArenaAllocator {
 public:
  static constexpr size_t kAlignment = 256;

  explicit ArenaAllocator(size_t capacity);
  ArenaAllocator(const ArenaAllocator&) = delete;
  ArenaAllocator& operator=(const ArenaAllocator&) = delete;

  // Offset of a new block of at least `bytes` (> 0) bytes. RESOURCE_EXHAUSTED when no free range
  // fits, with requested bytes, tag, capacity, in use and largest free block in the message.
  absl::StatusOr<size_t> Allocate(size_t bytes, std::string_view tag);

  // Returns a block; `offset` must be a live block's offset (else: abort, a programmer error).
  void Free(size_t offset);

  ArenaStats stats() const;
  void ResetPeak();
  std::vector<ArenaBlock> LiveBlocks() const;

 private:
  struct LiveBlock {
    size_t size;
    std::string tag;
  };
  void InsertFree(size_t offset, size_t size);
  void EraseFree(std::map<size_t, size_t>::iterator it);
  size_t LargestFreeLocked() const;

  const size_t capacity_;
  mutable std::mutex mu_;
  std::map<size_t, size_t> free_by_offset_;           // offset -> size
  std::set<std::pair<size_t, size_t>> free_by_size_;  // (size, offset)
  std::map<size_t, LiveBlock> live_;                  // offset -> block
  size_t in_use_ = 0;
  size_t peak_ = 0;
  size_t total_allocations_ = 0;
};

}  // namespace megatrain::engine
