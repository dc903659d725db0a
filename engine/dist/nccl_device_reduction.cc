// NcclDeviceReduction: NCCL's in-place reduce-scatter on each device's copy_out stream.
#include "engine/dist/nccl_device_reduction.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/device/cuda_device.h"
#include "engine/device/cuda_stream.h"

namespace megatrain::engine::dist {

absl::StatusOr<std::unique_ptr<NcclDeviceReduction>> NcclDeviceReduction::Create(
    const std::vector<Device*>& devices, const NcclOptions& options) {
  std::vector<int> ordinals;
  for (size_t d = 0; d < devices.size(); ++d) {
    auto* cuda = dynamic_cast<CudaDevice*>(devices[d]);
    if (cuda == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("devices[", d, "] is not a CUDA device: NCCL reduces among GPUs"));
    }
    ordinals.push_back(cuda->ordinal());
  }
  absl::StatusOr<std::vector<NcclCommunicator>> ranks =
      NcclCommunicator::CreateForDevices(ordinals, options);
  if (!ranks.ok()) return ranks.status();
  return std::unique_ptr<NcclDeviceReduction>(
      new NcclDeviceReduction(std::move(ordinals), options, std::move(*ranks), nullptr));
}

absl::StatusOr<std::unique_ptr<NcclDeviceReduction>> NcclDeviceReduction::CreateOverHost(
    Communicator& host, Device& device, const NcclOptions& options) {
  auto* cuda = dynamic_cast<CudaDevice*>(&device);
  if (cuda == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", host.rank(), "'s device is not a CUDA device: NCCL reduces among GPUs"));
  }
  absl::StatusOr<NcclCommunicator> rank =
      NcclCommunicator::CreateOverHost(host, cuda->ordinal(), options);
  if (!rank.ok()) return rank.status();
  std::vector<NcclCommunicator> ranks;
  ranks.push_back(std::move(*rank));
  return std::unique_ptr<NcclDeviceReduction>(
      new NcclDeviceReduction({cuda->ordinal()}, options, std::move(ranks), &host));
}

NcclDeviceReduction::NcclDeviceReduction(std::vector<int> ordinals, const NcclOptions& options,
                                         std::vector<NcclCommunicator> ranks, Communicator* host)
    : ordinals_(std::move(ordinals)),
      options_(options),
      host_(host),
      world_(host != nullptr ? host->size() : static_cast<int>(ordinals_.size())),
      first_rank_(host != nullptr ? host->rank() : 0),
      ranks_(std::move(ranks)) {
  for (size_t r = 0; r < ranks_.size(); ++r) rank_mu_.push_back(std::make_unique<absl::Mutex>());
}

NcclDeviceReduction::~NcclDeviceReduction() {
  StopWatching();
  // Over the host, closing waits for the other processes' ranks, which may be anywhere after a
  // failure (or already gone): the members' destructors abort this process's rank instead.
  if (host_ != nullptr) return;
  bool all_usable = !ranks_.empty();
  for (const NcclCommunicator& rank : ranks_) all_usable = all_usable && rank.usable();
  // Closing waits for every rank; with one aborted it could only time out. The destructors
  // abort what is left.
  if (!all_usable) return;
  std::vector<NcclCommunicator*> all;
  for (NcclCommunicator& rank : ranks_) all.push_back(&rank);
  (void)NcclClose(absl::MakeSpan(all));
}

absl::Status NcclDeviceReduction::EnqueueReduceScatter(int rank, Stream& stream, const float* send,
                                                       float* recv, size_t shard_elements,
                                                       const TimelineTag& tag) {
  const int local = rank - first_rank_;
  if (rank < 0 || rank >= world() || local < 0 || local >= static_cast<int>(ordinals_.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reduce-scatter: rank=", rank, " is outside the world of ", world(),
        host_ != nullptr ? absl::StrCat(" or not this process's (rank ", first_rank_, ")") : ""));
  }
  if (!recreate_status_.ok()) return recreate_status_;
  auto* cuda = dynamic_cast<CudaStream*>(&stream);
  if (cuda == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("reduce-scatter: rank ", rank, "'s stream ",
                                                   std::string(stream.name()),
                                                   " is not a CUDA stream"));
  }
  absl::MutexLock lock(rank_mu_[static_cast<size_t>(local)].get());
  NcclCommunicator& comm = ranks_[static_cast<size_t>(local)];
  cudaEvent_t done = nullptr;
  absl::Status enqueued = cuda->EnqueueTimed(tag, [&](cudaStream_t s) -> absl::Status {
    if (absl::Status r = comm.ReduceScatterSum(send, recv, shard_elements, s); !r.ok()) return r;
    // What the deadline thread polls: the reduce-scatter's kernel has finished once this has.
    cudaError_t e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    if (e == cudaSuccess) {
      e = cudaEventRecord(done, s);
      if (e != cudaSuccess) (void)cudaEventDestroy(done);
    }
    if (e != cudaSuccess) {
      done = nullptr;
      return absl::InternalError(absl::StrCat("reduce-scatter on rank ", rank,
                                              ": recording its completion event: ",
                                              cudaGetErrorString(e)));
    }
    return absl::OkStatus();
  });
  if (!enqueued.ok()) return enqueued;
  absl::MutexLock watch(&watch_mu_);
  pending_.push_back({done, local, absl::Now() + options_.collective_timeout});
  if (!watcher_.joinable()) watcher_ = std::thread([this] { WatchDeadlines(); });
  return absl::OkStatus();
}

void NcclDeviceReduction::WatchDeadlines() {
  absl::MutexLock lock(&watch_mu_);
  std::vector<bool> aborted(ordinals_.size(), false);
  while (!stop_watching_) {
    std::vector<int> overdue;
    const absl::Time now = absl::Now();
    for (auto it = pending_.begin(); it != pending_.end();) {
      // An event is queried on its own device.
      (void)cudaSetDevice(ordinals_[static_cast<size_t>(it->local)]);
      const cudaError_t state = cudaEventQuery(it->done);
      if (state == cudaErrorNotReady) {
        // Still running: overdue once past its deadline, and polled on until the abort drains it.
        if (now > it->deadline && !aborted[static_cast<size_t>(it->local)]) {
          aborted[static_cast<size_t>(it->local)] = true;
          overdue.push_back(it->local);
        }
        ++it;
        continue;
      }
      if (state != cudaSuccess && failure_.ok()) {
        failure_ = absl::InternalError(absl::StrCat(
            "rank ", first_rank_ + it->local, ": a reduce-scatter on GPU ",
            ordinals_[static_cast<size_t>(it->local)], " failed: ", cudaGetErrorString(state)));
      }
      (void)cudaEventDestroy(it->done);
      it = pending_.erase(it);
    }
    if (pending_.empty()) std::fill(aborted.begin(), aborted.end(), false);
    if (!overdue.empty()) {
      if (failure_.ok()) {
        failure_ = absl::DeadlineExceededError(absl::StrCat(
            "rank ", first_rank_ + overdue.front(), ": a reduce-scatter on GPU ",
            ordinals_[static_cast<size_t>(overdue.front())], " did not finish within ",
            absl::FormatDuration(options_.collective_timeout),
            " (NcclOptions::collective_timeout): another rank's process or GPU is hung or dead; "
            "its NCCL communicator was aborted"));
      }
      // Not under watch_mu_: a lane thread holds its rank's lock while it enqueues, then takes
      // watch_mu_ (the order is rank, then watch).
      watch_mu_.Unlock();
      for (int local : overdue) {
        absl::MutexLock rank_lock(rank_mu_[static_cast<size_t>(local)].get());
        ranks_[static_cast<size_t>(local)].Abort();  // ends its kernels: the event completes
      }
      watch_mu_.Lock();
      continue;
    }
    watch_mu_.AwaitWithTimeout(absl::Condition(&stop_watching_),
                               pending_.empty() ? absl::Milliseconds(100) : absl::Milliseconds(2));
  }
}

void NcclDeviceReduction::StopWatching() {
  {
    absl::MutexLock lock(&watch_mu_);
    stop_watching_ = true;
  }
  if (watcher_.joinable()) watcher_.join();
  absl::MutexLock lock(&watch_mu_);
  // An event still recorded is released by CUDA once it completes.
  for (const Pending& p : pending_) (void)cudaEventDestroy(p.done);
  pending_.clear();
}

absl::Status NcclDeviceReduction::Failure() {
  absl::MutexLock lock(&watch_mu_);
  return failure_;
}

void NcclDeviceReduction::Abort() {
  for (size_t r = 0; r < ranks_.size(); ++r) {
    absl::MutexLock lock(rank_mu_[r].get());
    ranks_[r].Abort();  // ends its kernels, so a stream waiting in a collective drains
  }
}

void NcclDeviceReduction::Reset() {
  {
    // The last step's reduce-scatters have drained (its streams were waited for, aborted ones
    // included); let the deadline thread see them finish, so no abort meant for the old step
    // reaches the communicators made below, then forget the old step's failure.
    absl::MutexLock lock(&watch_mu_);
    watch_mu_.AwaitWithTimeout(
        absl::Condition(+[](std::vector<Pending>* p) { return p->empty(); }, &pending_),
        options_.collective_timeout);
    failure_ = absl::OkStatus();
  }
  // After a failed step, or a Reset that could not make them (then it tries again).
  bool all_usable = ranks_.size() == ordinals_.size() && recreate_status_.ok();
  for (const NcclCommunicator& rank : ranks_) all_usable = all_usable && rank.usable();
  if (all_usable) return;
  if (host_ != nullptr) {
    // Forming the world again is a collective over the host, which only this rank would be
    // making: the job must end and resume from its last checkpoint instead.
    recreate_status_ = absl::FailedPreconditionError(absl::StrCat(
        "rank ", first_rank_, ": the NCCL communicator among the processes was aborted by a "
        "failed step; the job must end and resume from its last checkpoint"));
    return;
  }
  // A failed step aborted them: no lane thread runs now, so fresh ones can be made.
  std::vector<NcclCommunicator> old = std::move(ranks_);
  old.clear();
  absl::StatusOr<std::vector<NcclCommunicator>> fresh =
      NcclCommunicator::CreateForDevices(ordinals_, options_);
  if (!fresh.ok()) {
    recreate_status_ = absl::Status(
        fresh.status().code(),
        absl::StrCat("NCCL communicators could not be made again after a failed step: ",
                     fresh.status().message()));
    return;
  }
  ranks_ = std::move(*fresh);
  recreate_status_ = absl::OkStatus();
}

}  // namespace megatrain::engine::dist
