// CpuDeviceReduction: DeviceReduction among the CPU devices of one process, summing in rank
// order on each device's own stream thread.
//
// Each rank's host task waits until every rank has posted its send buffer for the same call, adds
// its shard over the ranks in rank order (rank 0's value, + rank 1's, + ...: the adds one device
// makes when it sums the same micro-batches in that order, so a step of one micro-batch per
// device gives one device's accumulation bit for bit), then waits until every rank is done
// reading before its stream goes on (so no rank overwrites a buffer another still reads).
// Abort (a micro-batch failed) releases every waiter without touching its buffer.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "engine/exec/device_reduction.h"

namespace megatrain::engine {

class CpuDeviceReduction final : public DeviceReduction {
 public:
  explicit CpuDeviceReduction(int world);
  CpuDeviceReduction(const CpuDeviceReduction&) = delete;
  CpuDeviceReduction& operator=(const CpuDeviceReduction&) = delete;

  int world() const override { return world_; }
  std::string_view order() const override { return "rank order"; }
  absl::Status EnqueueReduceScatter(int rank, Stream& stream, const float* send, float* recv,
                                    size_t shard_elements, const TimelineTag& tag) override;
  void Abort() override;
  void Reset() override;

 private:
  // One reduce-scatter, matched across ranks by its index in each rank's sequence of calls.
  struct Call {
    std::vector<const float*> sends;
    size_t shard_elements = 0;
    int posted = 0;
    int finished = 0;
    int left = 0;
  };
  absl::Status Run(int rank, uint64_t index, const float* send, float* recv, size_t shard_elements);

  const int world_;
  absl::Mutex mu_;
  std::vector<uint64_t> enqueued_ ABSL_GUARDED_BY(mu_);  // per rank: calls enqueued this step
  std::map<uint64_t, Call> calls_ ABSL_GUARDED_BY(mu_);
  // Abort: waiters return at once, leaving their buffers as they were and their streams healthy
  // (a stream's error is sticky; the step fails through the micro-batch that failed).
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status out_of_step_ ABSL_GUARDED_BY(mu_);  // ranks that disagree: every rank fails
};

}  // namespace megatrain::engine
