// CommunicatorDeviceReduction (see communicator_device_reduction.h).
#include "engine/dist/communicator_device_reduction.h"

#include "absl/strings/str_cat.h"

namespace megatrain::engine::dist {

absl::Status CommunicatorDeviceReduction::EnqueueReduceScatter(int rank, Stream& stream,
                                                               const float* send, float* recv,
                                                               size_t shard_elements,
                                                               const TimelineTag& tag) {
  if (rank != comm_.rank()) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce-scatter: rank=", rank, " but this process is rank ", comm_.rank(),
                     " of ", comm_.size(), " (one device per process)"));
  }
  if ((send == nullptr || recv == nullptr) && shard_elements > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce-scatter: rank ", rank,
                     "'s send or recv is null for shard_elements=", shard_elements));
  }
  stream.EnqueueFallibleHostTask(
      [this, send, recv, shard_elements]() -> absl::Status {
        if (aborted_) return absl::OkStatus();  // the step fails through its micro-batch
        return comm_.ReduceScatterFloatsInRankOrder(send, recv, shard_elements);
      },
      tag);
  return absl::OkStatus();
}

}  // namespace megatrain::engine::dist
