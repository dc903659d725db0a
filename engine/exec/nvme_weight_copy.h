// Enqueues a host-to-device weight copy whose source is the compute copy on the
// NVMe tier: for each chunk the range covers, the enqueuing thread waits until
// the chunk is staged in RAM (NvmeComputeCopy::AcquireForCopy, read ahead in
// unit order), enqueues the copy from the staged bytes, then a copy-in task
// that releases the chunk once the copy has landed.
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "engine/device/device.h"
#include "engine/exec/nvme_compute_copy.h"

namespace megatrain::engine {

// Elements [first, first + count) of `entry`'s compute copy to `dst` on the
// device. The entry's optimizer update must already be published (the caller
// waits for it on this thread). An NVMe error is returned, naming file and
// offset; what was enqueued before it still drains.
absl::Status EnqueueNvmeWeightCopy(Stream& copy_in, NvmeComputeCopy& copy, int entry, size_t first,
                                   size_t count, void* dst, const TimelineTag& tag);

}  // namespace megatrain::engine
