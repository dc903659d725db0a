// DeviceReduction: the reduce-scatter that sums a step's gradients across the devices of one
// process before they leave the devices (docs/scale_out.md "Reduce-scatter on the devices").
//
// Every device of the job (rank r of world() ranks) sends an fp32 buffer of shard * world()
// elements: its own sum of an entry's gradient over its micro-batches, or one micro-batch's
// gradient. A reduce-scatter leaves in rank r's recv[0, shard) the sum over every rank's
// send[r * shard, (r + 1) * shard). recv may be send + r * shard (NCCL's in-place form; the rest
// of send is then undefined afterwards) or a buffer of its own. Each device then copies only its
// shard to the host, 1/world() of the gradient over its link. Every rank makes the same calls,
// for the same shard sizes, in the same order.
#pragma once

#include <cstddef>
#include <string_view>

#include "absl/status/status.h"
#include "engine/device/device.h"

namespace megatrain::engine {

class DeviceReduction {
 public:
  virtual ~DeviceReduction() = default;

  virtual int world() const = 0;
  // How the sum is ordered, for reports: "rank order" (bitwise one device's accumulation when
  // each device runs one micro-batch) or "nccl" (NCCL's order: within fp32 rounding of it).
  virtual std::string_view order() const = 0;

  // Enqueues the reduce-scatter of rank's `send` (shard * world() floats of rank's device) into
  // its `recv` (shard floats) on `stream` (a stream of that device) and returns once enqueued;
  // later work on the stream sees the result. INVALID_ARGUMENT for a rank outside the world or a
  // null buffer.
  virtual absl::Status EnqueueReduceScatter(int rank, Stream& stream, const float* send,
                                            float* recv, size_t shard_elements,
                                            const TimelineTag& tag) = 0;

  // A micro-batch failed: the step fails, so no rank may be left waiting for a peer that will
  // never call. Every pending and later reduce-scatter returns without a result (its recv is
  // undefined) until Reset.
  virtual void Abort() = 0;
  // Start of a step (no reduce-scatter in flight): calls are counted afresh and an abort is
  // forgotten where the implementation can recover from it.
  virtual void Reset() = 0;
  // Why a reduce-scatter of this step failed after it was enqueued (NCCL: its kernel did not
  // finish within the collective timeout, a peer being dead or hung, and its communicator was
  // aborted so the stream drained with an undefined result), or OK. The step must then fail:
  // checked once every lane is done (RunMicroBatchesOnLanes). Until Reset.
  virtual absl::Status Failure() { return absl::OkStatus(); }
};

// The label of an executor's reduce-scatter span (on its copy_out stream).
inline constexpr char kReduceScatterLabel[] = "reduce-scatter";

// Floats of each rank's shard when n floats are split over `world` ranks: ceil(n / world).
inline size_t ReductionShardElements(size_t n, int world) {
  const size_t w = static_cast<size_t>(world);
  return (n + w - 1) / w;
}

}  // namespace megatrain::engine
