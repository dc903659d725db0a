// CpuDeviceReduction: a rendezvous per call, each rank summing its own shard in rank order.
#include "engine/exec/cpu_device_reduction.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/common/fatal.h"

namespace megatrain::engine {

CpuDeviceReduction::CpuDeviceReduction(int world)
    : world_(world), enqueued_(static_cast<size_t>(std::max(world, 1)), 0) {
  if (world < 1) internal::DieBecause("CpuDeviceReduction needs a world of at least one rank");
}

absl::Status CpuDeviceReduction::EnqueueReduceScatter(int rank, Stream& stream, const float* send,
                                                      float* recv, size_t shard_elements,
                                                      const TimelineTag& tag) {
  if (rank < 0 || rank >= world_) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce-scatter: rank=", rank, " is outside the world of ", world_));
  }
  if ((send == nullptr || recv == nullptr) && shard_elements > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce-scatter: rank ", rank,
                     "'s send or recv is null for shard_elements=", shard_elements));
  }
  uint64_t index = 0;
  {
    absl::MutexLock lock(&mu_);
    index = enqueued_[static_cast<size_t>(rank)]++;
  }
  stream.EnqueueFallibleHostTask(
      [this, rank, index, send, recv, shard_elements] {
        return Run(rank, index, send, recv, shard_elements);
      },
      tag);
  return absl::OkStatus();
}

absl::Status CpuDeviceReduction::Run(int rank, uint64_t index, const float* send, float* recv,
                                     size_t shard_elements) {
  std::vector<const float*> sends;
  {
    absl::MutexLock lock(&mu_);
    Call& call = calls_[index];
    if (call.sends.empty()) {
      call.sends.assign(static_cast<size_t>(world_), nullptr);
      call.shard_elements = shard_elements;
    } else if (call.shard_elements != shard_elements && out_of_step_.ok()) {
      // The ranks' calls are out of step (a programmer error): fail every rank, not just this.
      out_of_step_ = absl::InternalError(absl::StrCat(
          "reduce-scatter ", index, ": rank ", rank, " has shard_elements=", shard_elements,
          " but another rank ", call.shard_elements, " (the ranks' calls are out of step)"));
    }
    call.sends[static_cast<size_t>(rank)] = send;
    ++call.posted;
    auto everyone_posted = [this, &call]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return call.posted == world_ || aborted_ || !out_of_step_.ok();
    };
    mu_.Await(absl::Condition(&everyone_posted));
    if (!out_of_step_.ok()) return out_of_step_;
    if (aborted_) return absl::OkStatus();
    sends = call.sends;
  }
  // Rank r writes only its recv, which no other rank reads (in place, its own range of its send):
  // the ranks' sums run in parallel without a race.
  const size_t begin = static_cast<size_t>(rank) * shard_elements;
  for (size_t j = 0; j < shard_elements; ++j) {
    float sum = sends[0][begin + j];
    for (size_t r = 1; r < sends.size(); ++r) sum += sends[r][begin + j];
    recv[j] = sum;
  }
  absl::MutexLock lock(&mu_);
  Call& call = calls_[index];
  ++call.finished;
  // The others may still read this rank's send: its stream goes on (and may overwrite it) only
  // once every rank has summed its shard.
  auto everyone_finished = [this, &call]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return call.finished == world_ || aborted_ || !out_of_step_.ok();
  };
  mu_.Await(absl::Condition(&everyone_finished));
  if (!out_of_step_.ok()) return out_of_step_;
  if (aborted_) return absl::OkStatus();
  if (++call.left == world_) calls_.erase(index);
  return absl::OkStatus();
}

void CpuDeviceReduction::Abort() {
  absl::MutexLock lock(&mu_);
  aborted_ = true;
}

void CpuDeviceReduction::Reset() {
  absl::MutexLock lock(&mu_);
  std::fill(enqueued_.begin(), enqueued_.end(), 0);
  calls_.clear();
  aborted_ = false;
  out_of_step_ = absl::OkStatus();
}

}  // namespace megatrain::engine
