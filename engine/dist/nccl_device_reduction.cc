// NcclDeviceReduction: NCCL's in-place reduce-scatter on each device's copy_out stream.
#include "engine/dist/nccl_device_reduction.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/fatal.h"
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
  watcher_ = std::thread([this] { WatchDeadlines(); });
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
  // The events first: a collective in flight must never go unwatched. One pair per
  // reduce-scatter (microseconds, against a layer's gradients).
  cudaEvent_t events[2] = {nullptr, nullptr};
  for (cudaEvent_t& event : events) {
    if (cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
        e != cudaSuccess) {
      for (cudaEvent_t made : events) {
        if (made != nullptr) (void)cudaEventDestroy(made);
      }
      return absl::InternalError(absl::StrCat("reduce-scatter on rank ", rank,
                                              ": creating its events: ", cudaGetErrorString(e)));
    }
  }
  absl::MutexLock lock(rank_mu_[static_cast<size_t>(local)].get());
  NcclCommunicator& comm = ranks_[static_cast<size_t>(local)];
  bool recorded = false;
  absl::Status enqueued = cuda->EnqueueTimed(tag, [&](cudaStream_t s) -> absl::Status {
    // `start` completes once the stream reaches the collective: its deadline counts from then,
    // not from the enqueue (the forward and backward queued ahead of it may take minutes).
    if (cudaError_t e = cudaEventRecord(events[0], s); e != cudaSuccess) {
      return absl::InternalError(absl::StrCat("reduce-scatter on rank ", rank,
                                              ": recording its start: ", cudaGetErrorString(e)));
    }
    if (absl::Status r = comm.ReduceScatterSum(send, recv, shard_elements, s); !r.ok()) return r;
    if (cudaError_t e = cudaEventRecord(events[1], s); e != cudaSuccess) {
      // Enqueued but not watchable: abort it rather than leave it unbounded.
      comm.Abort();
      return absl::InternalError(absl::StrCat("reduce-scatter on rank ", rank,
                                              ": recording its end: ", cudaGetErrorString(e),
                                              "; its communicator was aborted"));
    }
    recorded = true;
    return absl::OkStatus();
  });
  if (!recorded) {
    // Destroying a recorded event is allowed: CUDA releases it once it completes.
    for (cudaEvent_t event : events) (void)cudaEventDestroy(event);
    return enqueued.ok() ? absl::InternalError("reduce-scatter: not enqueued") : enqueued;
  }
  absl::MutexLock watch(&watch_mu_);
  pending_.push_back({next_id_++, events[0], events[1], local, false, {}});
  return enqueued;
}

void NcclDeviceReduction::WatchDeadlines() {
  using Clock = std::chrono::steady_clock;
  // InfiniteDuration: no deadline (the events are still polled, so Reset knows they finished).
  const bool bounded = options_.collective_timeout != absl::InfiniteDuration();
  const auto timeout = bounded ? absl::ToChronoNanoseconds(options_.collective_timeout)
                               : std::chrono::nanoseconds(0);
  absl::MutexLock lock(&watch_mu_);
  while (!stop_watching_) {
    // The driver calls run without the lock (one could stall, and lanes take it to enqueue).
    const std::vector<Pending> snapshot = pending_;
    watch_mu_.Unlock();
    struct Seen {
      uint64_t id;
      bool started;
      bool finished;
    };
    std::vector<Seen> seen;
    for (const Pending& p : snapshot) {
      // An error other than "not ready" is the device's (a kernel's fault): the lanes' own waits
      // report it, so it is only an event that will not need watching.
      const bool started = p.started || cudaEventQuery(p.start) != cudaErrorNotReady;
      const bool finished = started && cudaEventQuery(p.done) != cudaErrorNotReady;
      seen.push_back({p.id, started, finished});
    }
    watch_mu_.Lock();
    const Clock::time_point now = Clock::now();
    bool overdue = false;
    int overdue_local = 0;
    for (const Seen& s : seen) {
      auto it = std::find_if(pending_.begin(), pending_.end(),
                             [&s](const Pending& p) { return p.id == s.id; });
      if (it == pending_.end()) continue;
      if (s.finished) {
        (void)cudaEventDestroy(it->start);
        (void)cudaEventDestroy(it->done);
        pending_.erase(it);
        continue;
      }
      if (s.started && !it->started) {
        it->started = true;
        it->deadline = now + timeout;
      }
      if (bounded && it->started && now > it->deadline && !aborted_by_deadline_) {
        overdue = true;
        overdue_local = it->local;
      }
    }
    if (overdue) {
      aborted_by_deadline_ = true;
      failure_ = absl::DeadlineExceededError(absl::StrCat(
          host_ != nullptr ? "rank " : "local rank ", first_rank_ + overdue_local,
          ": a reduce-scatter on GPU ", ordinals_[static_cast<size_t>(overdue_local)],
          " did not finish within ", absl::FormatDuration(options_.collective_timeout),
          " of starting (NcclOptions::collective_timeout): another rank's process or GPU is "
          "hung or dead; the NCCL communicators were aborted"));
      // Not under watch_mu_: a lane holds its rank's lock, then takes watch_mu_.
      watch_mu_.Unlock();
      AbortAllFromWatcher();
      watch_mu_.Lock();
      continue;
    }
    watch_mu_.AwaitWithTimeout(absl::Condition(&stop_watching_),
                               pending_.empty() ? absl::Milliseconds(100) : absl::Milliseconds(2));
  }
}

void NcclDeviceReduction::AbortAllFromWatcher() {
  // A lane may be stuck inside NCCL holding its rank's lock (a full work queue waits on the
  // hung kernel). Only NCCL's abort flag frees it, and aborting under the lane's call would race
  // this wrapper's state: past a grace period the process ends, which its launcher sees.
  constexpr absl::Duration kGrace = absl::Seconds(30);
  for (size_t r = 0; r < ranks_.size(); ++r) {
    absl::Mutex& mu = *rank_mu_[r];
    if (!mu.LockWhenWithTimeout(absl::Condition::kTrue, kGrace)) {
      internal::DieBecause(absl::StrCat("rank ", first_rank_ + static_cast<int>(r),
                                        ": a reduce-scatter passed its deadline "
                                        "and the thread enqueueing NCCL work on GPU ",
                                        ordinals_[r],
                                        " has been stuck in NCCL "
                                        "for ",
                                        absl::FormatDuration(kGrace),
                                        " more; ending the process (resume the job from "
                                        "its last checkpoint)"));
    }
    ranks_[r].Abort();  // ends its kernels: the streams drain and the events complete
    mu.Unlock();
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
  for (const Pending& p : pending_) {
    (void)cudaEventDestroy(p.start);
    (void)cudaEventDestroy(p.done);
  }
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
    if (!watch_mu_.AwaitWithTimeout(
            absl::Condition(
                +[](std::vector<Pending>* p) { return p->empty(); }, &pending_),
            options_.collective_timeout)) {
      recreate_status_ = absl::InternalError(absl::StrCat(
          "a reduce-scatter of the last step on rank ", first_rank_,
          " never finished, even aborted; the job must end and resume from its last checkpoint"));
      return;
    }
    failure_ = absl::OkStatus();
    aborted_by_deadline_ = false;
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
  // A failed step aborted them: no lane thread runs now, so fresh ones can be made (under every
  // rank's lock: the deadline thread aborts through them).
  std::vector<std::unique_ptr<absl::MutexLock>> held;
  for (const std::unique_ptr<absl::Mutex>& mu : rank_mu_) {
    held.push_back(std::make_unique<absl::MutexLock>(mu.get()));
  }
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
