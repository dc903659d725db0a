// CommunicatorDeviceReduction: the reduce-scatter of DeviceReduction among processes, one CPU
// device each, over the job's Communicator (MPI across processes): data parallelism whose
// gradients leave each device already reduced, 1/W of them per device
// (docs/scale_out.md "Reduce-scatter across ranks").
//
// The reduction runs as a host task on the device's stream (the CPU device's buffers are host
// memory), in rank order (Communicator::ReduceScatterFloatsInRankOrder): with one micro-batch per
// rank, the bits of one process accumulating the ranks' micro-batches. The trainer's thread waits
// for the streams meanwhile, so the communicator is never called from two threads at once.
// Abort cannot call back a rank already waiting in the transport: a failed step ends the job
// (train_local's MPI_Abort) or, in a library, waits out the collective deadline.
#pragma once

#include <atomic>

#include "engine/dist/communicator.h"
#include "engine/exec/device_reduction.h"

namespace megatrain::engine::dist {

class CommunicatorDeviceReduction final : public DeviceReduction {
 public:
  explicit CommunicatorDeviceReduction(Communicator& comm) : comm_(comm) {}
  CommunicatorDeviceReduction(const CommunicatorDeviceReduction&) = delete;
  CommunicatorDeviceReduction& operator=(const CommunicatorDeviceReduction&) = delete;

  int world() const override { return comm_.size(); }
  std::string_view order() const override { return "rank order"; }
  // `rank` must be this process's (its one device's) rank in the communicator.
  absl::Status EnqueueReduceScatter(int rank, Stream& stream, const float* send, float* recv,
                                    size_t shard_elements, const TimelineTag& tag) override;
  // Later reduce-scatters of this step return at once without a result.
  void Abort() override { aborted_ = true; }
  void Reset() override { aborted_ = false; }

 private:
  Communicator& comm_;
  std::atomic<bool> aborted_{false};
};

}  // namespace megatrain::engine::dist
