// NVMe gradient offload: chunk by chunk through pinned staging on the copy-out stream.
#include "engine/exec/nvme_gradient_offload.h"

#include <algorithm>
#include <cstring>
#include <memory>

namespace megatrain::engine {

void EnqueueNvmeGradientOffload(Stream& copy_out, NvmeGradients& grads, int entry,
                                const float* src, bool overwrite, float* staging,
                                size_t staging_floats, const TimelineTag& tag) {
  NvmeGradients* g = &grads;
  for (int c = 0; c < grads.num_chunks(entry); ++c) {
    const EntryChunk chunk = grads.chunk(entry, c);
    // Where the chunk is staged, known only once BeginChunk has run in stream order.
    auto dst = std::make_shared<float*>(nullptr);
    copy_out.EnqueueFallibleHostTask(
        [g, entry, c, overwrite, dst]() -> absl::Status {
          absl::StatusOr<float*> staged = g->BeginChunk(entry, c, overwrite);
          if (!staged.ok()) return staged.status();
          *dst = *staged;
          return absl::OkStatus();
        },
        {SpanKind::kCopyOut, "gradient chunk from NVMe", tag.layer});
    for (size_t done = 0; done < chunk.count; done += staging_floats) {
      const size_t n = std::min(staging_floats, chunk.count - done);
      copy_out.CopyDeviceToHost(staging, src + chunk.first + done, n * sizeof(float), tag);
      copy_out.EnqueueHostTask(
          [dst, staging, done, n, overwrite] {
            if (*dst == nullptr) return;  // BeginChunk failed: the stream's error says why
            float* out = *dst + done;
            if (overwrite) {
              std::memcpy(out, staging, n * sizeof(float));
            } else {
              for (size_t j = 0; j < n; ++j) out[j] += staging[j];
            }
          },
          {SpanKind::kCopyOut, overwrite ? "store gradients" : "accumulate gradients", tag.layer});
    }
    copy_out.EnqueueFallibleHostTask(
        [g, entry, c, dst]() -> absl::Status {
          if (*dst == nullptr) return absl::OkStatus();
          return g->EndChunk(entry, c);
        },
        {SpanKind::kCopyOut, "gradient chunk to NVMe", tag.layer});
  }
}

}  // namespace megatrain::engine
