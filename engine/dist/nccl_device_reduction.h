// NcclDeviceReduction: DeviceReduction over NCCL among the CUDA devices of one process, one
// communicator per device (ncclCommInitAll's world), each driven by its device's lane thread; or
// among processes, one GPU each (CreateOverHost: the world formed over the job's host
// Communicator, this process's one rank being the host rank).
//
// The reduce-scatter is NCCL's (in place, or into a shard buffer) on the executor's copy_out
// stream: sums in NCCL's order (docs/scale_out.md "What is not bitwise"), within fp32 rounding of
// one device's accumulation, repeatable run to run. A failed step aborts the communicators (so no
// device is left in a collective its peer never joins); the next step's Reset makes fresh ones.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/device/device.h"
#include "engine/dist/nccl_communicator.h"
#include "engine/exec/device_reduction.h"

namespace megatrain::engine::dist {

class NcclDeviceReduction final : public DeviceReduction {
 public:
  // One rank per entry of `devices` (CUDA devices of this process, distinct ordinals), rank i on
  // devices[i]. INVALID_ARGUMENT naming the entry that is not a CUDA device.
  static absl::StatusOr<std::unique_ptr<NcclDeviceReduction>> Create(
      const std::vector<Device*>& devices, const NcclOptions& options = {});
  // One rank per process: this process's `device` is rank host.rank() of host.size(), the
  // ncclUniqueId broadcast over `host` (NcclCommunicator::CreateOverHost). Every rank must call
  // it (a collective). After an Abort (a failed step) it is not formed again: Reset leaves every
  // later call FAILED_PRECONDITION, since re-forming would be a collective only this rank makes
  // (the job ends and resumes from its checkpoint: train_local aborts every rank).
  static absl::StatusOr<std::unique_ptr<NcclDeviceReduction>> CreateOverHost(
      Communicator& host, Device& device, const NcclOptions& options = {});
  // Closes the communicators, this process's ranks as one group; over the host it aborts its
  // rank instead (closing would wait for the other processes, wherever they are).
  ~NcclDeviceReduction() override;

  int world() const override { return world_; }
  std::string_view order() const override { return "nccl"; }
  absl::Status EnqueueReduceScatter(int rank, Stream& stream, const float* send, float* recv,
                                    size_t shard_elements, const TimelineTag& tag) override;
  void Abort() override;
  void Reset() override;
  absl::Status Failure() override;

 private:
  // A reduce-scatter enqueued and not yet seen finished: events recorded on its stream just
  // before and just after it, and, once `start` has completed (the kernel can run: everything
  // queued ahead of it on the stream is done), when it must have finished.
  struct Pending {
    uint64_t id = 0;
    cudaEvent_t start = nullptr;
    cudaEvent_t done = nullptr;
    int local = 0;  // index in ranks_ / ordinals_
    bool started = false;
    std::chrono::steady_clock::time_point deadline;
  };
  // The deadline thread: polls every pending reduce-scatter's events; one that started and has
  // not finished within collective_timeout makes failure_ DEADLINE_EXCEEDED and aborts every
  // communicator of this process, which ends their kernels (the streams drain, the lanes' waits
  // return). Without it a peer GPU or process that hangs would hold this rank's streams forever:
  // NCCL's non-blocking mode bounds the enqueue, not the kernel. A lane stuck inside NCCL while
  // holding its rank's lock past a grace period ends the process (nothing else can free it).
  void WatchDeadlines();
  void AbortAllFromWatcher();
  void StopWatching();

  NcclDeviceReduction(std::vector<int> ordinals, const NcclOptions& options,
                      std::vector<NcclCommunicator> ranks, Communicator* host);

  const std::vector<int> ordinals_;  // this process's GPUs, one per rank it holds
  const NcclOptions options_;
  Communicator* const host_;  // over the host: the job's communicator (for its rank and size)
  const int world_;           // ordinals_.size(), or host_->size()
  const int first_rank_;      // the world rank of ranks_[0]: 0, or host_->rank()
  // One lock per rank: a rank's lane thread holds it while NCCL enqueues (bounded by the
  // collective timeout), Abort takes each in turn, so no communicator is aborted under a call.
  std::vector<std::unique_ptr<absl::Mutex>> rank_mu_;
  std::vector<NcclCommunicator> ranks_;
  absl::Status recreate_status_;  // why Reset could not make fresh communicators
  absl::Mutex watch_mu_;
  std::vector<Pending> pending_ ABSL_GUARDED_BY(watch_mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(watch_mu_) = 0;
  absl::Status failure_ ABSL_GUARDED_BY(watch_mu_);
  bool aborted_by_deadline_ ABSL_GUARDED_BY(watch_mu_) = false;
  bool stop_watching_ ABSL_GUARDED_BY(watch_mu_) = false;
  std::thread watcher_;  // started by the constructor; last: it uses the above
};

}  // namespace megatrain::engine::dist
