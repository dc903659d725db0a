// NVMe gradient offload: chunk by chunk through pinned staging on the copy-out stream.
#include "engine/exec/nvme_gradient_offload.h"

#include <algorithm>
#include <cstring>
#include <memory>

namespace megatrain::engine {

void EnqueueNvmeGradientOffload(Stream& copy_out, NvmeGradients& grads, int entry,
                                const float* src, size_t first, size_t count, bool overwrite,
                                float* staging, size_t staging_floats, const TimelineTag& tag) {
  NvmeGradients* g = &grads;
  const size_t end = first + count;
  for (int c = 0; c < grads.num_chunks(entry); ++c) {
    const EntryChunk chunk = grads.chunk(entry, c);
    const size_t chunk_end = chunk.first + chunk.count;
    if (chunk_end <= first || chunk.first >= end) continue;
    const bool begins = chunk.first >= first;
    const bool ends = chunk_end <= end;
    const size_t lo = std::max(first, chunk.first);
    const size_t hi = std::min(end, chunk_end);
    // Where the chunk is staged, known only once BeginChunk has run in stream order.
    auto dst = std::make_shared<float*>(nullptr);
    copy_out.EnqueueFallibleHostTask(
        [g, entry, c, overwrite, begins, dst]() -> absl::Status {
          absl::StatusOr<float*> staged =
              begins ? g->BeginChunk(entry, c, overwrite) : g->Staged(entry, c);
          if (!staged.ok()) return staged.status();
          *dst = *staged;
          return absl::OkStatus();
        },
        {SpanKind::kCopyOut, begins ? "gradient chunk from NVMe" : "gradient chunk", tag.layer});
    for (size_t done = lo; done < hi; done += staging_floats) {
      const size_t n = std::min(staging_floats, hi - done);
      copy_out.CopyDeviceToHost(staging, src + (done - first), n * sizeof(float), tag);
      copy_out.EnqueueHostTask(
          [dst, staging, at = done - chunk.first, n, overwrite] {
            if (*dst == nullptr) return;  // BeginChunk failed: the stream's error says why
            float* out = *dst + at;
            if (overwrite) {
              std::memcpy(out, staging, n * sizeof(float));
            } else {
              for (size_t j = 0; j < n; ++j) out[j] += staging[j];
            }
          },
          {SpanKind::kCopyOut, overwrite ? "store gradients" : "accumulate gradients", tag.layer});
    }
    if (!ends) continue;
    copy_out.EnqueueFallibleHostTask(
        [g, entry, c, dst]() -> absl::Status {
          if (*dst == nullptr) return absl::OkStatus();
          return g->EndChunk(entry, c);
        },
        {SpanKind::kCopyOut, "gradient chunk to NVMe", tag.layer});
  }
}

}  // namespace megatrain::engine
