// CpuPinnedPool: page-aligned allocation (mlock works on whole pages, so buffers never share one)
// and the degrade-once mlock policy (`ulimit -l` is often a few MiB).
#include "engine/device/cpu_pinned_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/huge_pages.h"

namespace megatrain::engine {
namespace {

size_t PageSize() {
  const long page = sysconf(_SC_PAGESIZE);
  return page > 0 ? static_cast<size_t>(page) : 4096;
}

size_t RoundUp(size_t bytes, size_t alignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}

}  // namespace

CpuPinnedPool::CpuPinnedPool(size_t budget_bytes, std::string device_name)
    : PinnedMemoryPool(budget_bytes), device_name_(std::move(device_name)) {}

CpuPinnedPool::~CpuPinnedPool() { CheckNoLiveBuffers(); }

absl::StatusOr<void*> CpuPinnedPool::AllocateRaw(size_t bytes) {
  // Big buffers (master and gradient slabs) start on a huge page so the
  // optimizer's streaming passes run on 2 MiB pages (see huge_pages.h); the
  // advice comes before mlock, the first touch.
  void* data = AllocateStreamingArray(bytes, PageSize());
  if (data == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "device '", device_name_, "': host allocation of ", bytes, " pinned bytes failed"));
  }
  // Lock what was asked for (to whole small pages), not the alignment tail.
  const size_t locked = RoundUp(bytes, PageSize());
  if (mlock(data, locked) != 0) {
    const int error = errno;
    if (!mlock_degraded_.exchange(true)) {
      std::fprintf(stderr,
                   "megatrain warning: device '%s': mlock of %zu bytes failed (%s); pinned "
                   "buffers on the CPU device continue as pageable memory (raise `ulimit -l` "
                   "to lock them)\n",
                   device_name_.c_str(), locked, std::strerror(error));
    }
  }
  return data;
}

void CpuPinnedPool::FreeRaw(void* data, size_t bytes) {
  // Harmless when the pages were never locked; pages are never shared between buffers.
  munlock(data, RoundUp(bytes, PageSize()));
  std::free(data);
}

}  // namespace megatrain::engine
