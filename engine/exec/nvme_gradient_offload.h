// Enqueues the offload of an entry's gradient, or of a range of it, to the
// NVMe tier on the copy-out stream: per chunk, NvmeGradients::BeginChunk, the
// chunk's pieces copied device-to-host through bounded pinned staging and
// stored or added in place, then EndChunk (norm partials, asynchronous
// write-back). Errors become the stream's sticky error and fail the
// micro-batch.
#pragma once

#include <cstddef>

#include "engine/device/device.h"
#include "engine/exec/nvme_gradients.h"

namespace megatrain::engine {

// `src` is the gradient of elements [first, first + count) of the entry on
// the device; `staging` holds `staging_floats` pinned floats, free in stream
// order; `overwrite` for the first contribution of the step (else added to
// what the file holds). Ranges of one entry must come in increasing order and
// cover it whole within a step: a chunk is begun by the range holding its
// first element and ended by the one holding its last. Sums in the same
// order as the RAM path (staged values added element by element to the
// running sum), so results are bitwise those of RAM slabs.
void EnqueueNvmeGradientOffload(Stream& copy_out, NvmeGradients& grads, int entry,
                                const float* src, size_t first, size_t count, bool overwrite,
                                float* staging, size_t staging_floats, const TimelineTag& tag);

}  // namespace megatrain::engine
