// AdviseHugePages: madvise(MADV_HUGEPAGE) on the huge-page-aligned interior of a range;
// AllocateStreamingArray: huge-page-aligned, advised allocation of big host arrays.
#include "engine/common/huge_pages.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace megatrain::engine {

absl::Status AdviseHugePages(void* data, size_t bytes) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  if (data == nullptr || bytes < kHugePageBytes || begin > UINTPTR_MAX - bytes) {
    return absl::OkStatus();
  }
  const uintptr_t first = (begin + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  const uintptr_t last = (begin + bytes) / kHugePageBytes * kHugePageBytes;
  if (first >= last) return absl::OkStatus();
  if (madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE) != 0) {
    const int error = errno;
    return absl::UnavailableError(absl::StrCat("madvise(MADV_HUGEPAGE) of ", last - first,
                                               " bytes at ", std::to_string(first), ": ",
                                               std::string(std::strerror(error))));
  }
  return absl::OkStatus();
}

void* AllocateStreamingArray(size_t bytes, size_t small_alignment) {
  const size_t alignment = bytes >= kHugePageMinBytes ? kHugePageBytes : small_alignment;
  const size_t rounded = bytes == 0 ? alignment : (bytes + alignment - 1) / alignment * alignment;
  void* data = std::aligned_alloc(alignment, rounded);
  // It is advice: memory that stays on small pages is still usable.
  if (data != nullptr) AdviseHugePages(data, bytes).IgnoreError();
  return data;
}

}  // namespace megatrain::engine
