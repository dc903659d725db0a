// NVMe weight copies: staged chunk by chunk, released by the copy-in stream after each copy.
#include "engine/exec/nvme_weight_copy.h"

#include <algorithm>

namespace megatrain::engine {

absl::Status EnqueueNvmeWeightCopy(Stream& copy_in, NvmeComputeCopy& copy, int entry, size_t first,
                                   size_t count, void* dst, const TimelineTag& tag) {
  const size_t eb = copy.element_bytes();
  const size_t end = first + count;
  NvmeComputeCopy* staged_copy = &copy;
  for (int c = 0; c < copy.num_chunks(entry); ++c) {
    const EntryChunk chunk = copy.chunk(entry, c);
    const size_t lo = std::max(first, chunk.first);
    const size_t hi = std::min(end, chunk.first + chunk.count);
    if (lo >= hi) continue;
    absl::StatusOr<const char*> src =
        copy.AcquireForCopy(entry, c, [&copy_in] { return copy_in.Failure(); });
    if (!src.ok()) return src.status();
    copy_in.CopyHostToDevice(static_cast<char*>(dst) + (lo - first) * eb,
                             *src + (lo - chunk.first) * eb, (hi - lo) * eb, tag);
    copy_in.EnqueueHostTask([staged_copy, entry, c] { staged_copy->ReleaseAfterCopy(entry, c); },
                            {SpanKind::kCopyIn, "release NVMe weights", tag.layer});
  }
  return absl::OkStatus();
}

}  // namespace megatrain::engine
