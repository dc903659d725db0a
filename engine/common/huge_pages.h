// Transparent-huge-page advice for large host arrays (optimizer state, gradients).
#pragma once

#include <cstddef>

#include "absl/status/status.h"

namespace megatrain::engine {

// x86-64 transparent huge page size.
inline constexpr size_t kHugePageBytes = size_t{2} << 20;
// Host arrays from this size on are allocated huge-page aligned and advised
// (the alignment costs address space only: the unused head is never touched).
inline constexpr size_t kHugePageMinBytes = size_t{8} << 20;

// Asks the kernel to back the whole 2 MiB pages inside [data, data + bytes)
// with transparent huge pages (madvise MADV_HUGEPAGE). Call it before the
// first touch: pages already faulted in are only merged later, slowly, by
// khugepaged. Streaming passes over multi-GiB arrays on 4 KiB pages pay a
// page walk every 4 KiB per stream (two-level in a VM) and lose hardware
// prefetch at each 4 KiB boundary; on this VM that halved host AdamW
// throughput at 500M parameters.
//
// Returns OK without a system call when the range holds no whole huge page
// (including data == nullptr or bytes == 0). Allocate with kHugePageBytes
// alignment so no edge of the array is left on small pages. It is advice:
// results never depend on it, and an error (kernel without THP, range not
// mapped) leaves the memory usable on small pages, so callers may ignore it.
absl::Status AdviseHugePages(void* data, size_t bytes);

// The allocation every big host stream uses (optimizer state, pinned slabs):
// std::aligned_alloc of bytes rounded up to the alignment, which is
// kHugePageBytes from kHugePageMinBytes on (then advised with
// AdviseHugePages before anything touches it) and small_alignment (a power
// of two) below. Free with std::free. Returns nullptr when out of memory.
void* AllocateStreamingArray(size_t bytes, size_t small_alignment);

}  // namespace megatrain::engine
