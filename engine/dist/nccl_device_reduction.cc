// NcclDeviceReduction: NCCL's in-place reduce-scatter on each device's copy_out stream.
#include "engine/dist/nccl_device_reduction.h"

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
      new NcclDeviceReduction(std::move(ordinals), options, std::move(*ranks)));
}

NcclDeviceReduction::NcclDeviceReduction(std::vector<int> ordinals, const NcclOptions& options,
                                         std::vector<NcclCommunicator> ranks)
    : ordinals_(std::move(ordinals)), options_(options), ranks_(std::move(ranks)) {
  for (size_t r = 0; r < ranks_.size(); ++r) rank_mu_.push_back(std::make_unique<absl::Mutex>());
}

NcclDeviceReduction::~NcclDeviceReduction() {
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
  if (rank < 0 || rank >= world()) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce-scatter: rank=", rank, " is outside the world of ", world()));
  }
  if (!recreate_status_.ok()) return recreate_status_;
  auto* cuda = dynamic_cast<CudaStream*>(&stream);
  if (cuda == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("reduce-scatter: rank ", rank, "'s stream ",
                                                   std::string(stream.name()),
                                                   " is not a CUDA stream"));
  }
  absl::MutexLock lock(rank_mu_[static_cast<size_t>(rank)].get());
  NcclCommunicator& comm = ranks_[static_cast<size_t>(rank)];
  return cuda->EnqueueTimed(
      tag, [&](cudaStream_t s) { return comm.ReduceScatterSum(send, recv, shard_elements, s); });
}

void NcclDeviceReduction::Abort() {
  for (size_t r = 0; r < ranks_.size(); ++r) {
    absl::MutexLock lock(rank_mu_[r].get());
    ranks_[r].Abort();  // ends its kernels, so a stream waiting in a collective drains
  }
}

void NcclDeviceReduction::Reset() {
  // After a failed step, or a Reset that could not make them (then it tries again).
  bool all_usable = static_cast<int>(ranks_.size()) == world() && recreate_status_.ok();
  for (const NcclCommunicator& rank : ranks_) all_usable = all_usable && rank.usable();
  if (all_usable) return;
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
