// NcclCommunicator: non-blocking NCCL communicators, every call followed by a bounded wait.
#include "engine/dist/nccl_communicator.h"

#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/dist/nccl_status.h"
#include "kernels/cuda/cuda_status.h"

namespace megatrain::engine::dist {
namespace {

using kernels::cuda::CudaStatus;

ncclConfig_t NonBlockingConfig() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

ncclDataType_t NcclType(NcclElement element) {
  return element == NcclElement::kBfloat16 ? ncclBfloat16 : ncclFloat32;
}

absl::Status CheckDevice(int device, int device_count, absl::string_view what) {
  if (device < 0 || device >= device_count) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", device,
                                                   " is not a CUDA device (this machine has ",
                                                   device_count, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  MT_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
  return count;
}

// Restores the calling thread's current CUDA device when it goes out of scope (the constructors
// switch devices to create each rank's communicator).
class CurrentDeviceRestorer {
 public:
  CurrentDeviceRestorer() { had_device_ = cudaGetDevice(&device_) == cudaSuccess; }
  CurrentDeviceRestorer(const CurrentDeviceRestorer&) = delete;
  CurrentDeviceRestorer& operator=(const CurrentDeviceRestorer&) = delete;
  ~CurrentDeviceRestorer() {
    if (had_device_) cudaSetDevice(device_);
  }

 private:
  int device_ = 0;
  bool had_device_ = false;
};

// What host rank 0 broadcasts: the id, or that it could not make one (so no rank waits for a
// world that will never form).
struct UniqueIdMessage {
  ncclUniqueId id;
  int ok;
};

}  // namespace

size_t NcclShardElements(size_t n, int world) {
  const size_t ranks = static_cast<size_t>(std::max(world, 1));
  return (n + ranks - 1) / ranks;
}

NcclCommunicator::NcclCommunicator(ncclComm* comm, int rank, int size, int device,
                                   const NcclOptions& options)
    : comm_(comm), rank_(rank), size_(size), device_(device), options_(options) {}

NcclCommunicator::NcclCommunicator(NcclCommunicator&& other) noexcept
    : comm_(std::exchange(other.comm_, nullptr)),
      rank_(other.rank_),
      size_(other.size_),
      device_(other.device_),
      options_(other.options_),
      in_group_(other.in_group_) {}

NcclCommunicator& NcclCommunicator::operator=(NcclCommunicator&& other) noexcept {
  if (this != &other) {
    Abort();
    comm_ = std::exchange(other.comm_, nullptr);
    rank_ = other.rank_;
    size_ = other.size_;
    device_ = other.device_;
    options_ = other.options_;
    in_group_ = other.in_group_;
  }
  return *this;
}

NcclCommunicator::~NcclCommunicator() { Abort(); }

void NcclCommunicator::Abort() {
  if (comm_ == nullptr) return;
  // Sets NCCL's abort flags at once (this rank's kernels and proxy quit), then frees the
  // communicator, in the background for a non-blocking one; there is nothing to report that the
  // caller could act on.
  ncclCommAbort(comm_);
  comm_ = nullptr;
}

absl::Status NcclCommunicator::Close() {
  NcclCommunicator* self = this;
  return NcclClose(absl::MakeSpan(&self, 1));
}

absl::Status NcclCommunicator::CheckUsable(const char* call) const {
  if (comm_ != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "rank ", rank_, ": ", call, ": the NCCL communicator was closed or aborted"));
}

absl::Status NcclCommunicator::Fail(int result, const char* call) {
  const char* detail = ncclGetLastError(comm_);
  return NcclStatus(static_cast<ncclResult_t>(result), call, rank_,
                    detail == nullptr ? "" : detail);
}

absl::Status NcclCommunicator::Settle(int result, const char* call, absl::Duration timeout) {
  if (result != ncclSuccess && result != ncclInProgress) return Fail(result, call);
  if (in_group_) return absl::OkStatus();  // deferred to ncclGroupEnd; NcclGroup waits then
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t query = ncclCommGetAsyncError(comm_, &state);
    if (query != ncclSuccess) {
      absl::Status status = Fail(query, "ncclCommGetAsyncError");
      Abort();
      return status;
    }
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) {
      absl::Status status = Fail(state, call);
      Abort();
      return status;
    }
    if (absl::Now() >= deadline) {
      Abort();
      return absl::DeadlineExceededError(absl::StrCat(
          "rank ", rank_, ": ", call, " did not complete within ", absl::FormatDuration(timeout),
          " (a peer is dead or never made the same call); the NCCL communicator was aborted"));
    }
    absl::SleepFor(options_.poll_interval);
  }
}

absl::StatusOr<std::vector<NcclCommunicator>> NcclCommunicator::CreateForDevices(
    absl::Span<const int> devices, const NcclOptions& options) {
  if (devices.empty()) return absl::InvalidArgumentError("devices: the list is empty");
  absl::StatusOr<int> device_count = CudaDeviceCount();
  if (!device_count.ok()) return device_count.status();
  for (size_t i = 0; i < devices.size(); ++i) {
    MT_RETURN_IF_ERROR(CheckDevice(devices[i], *device_count, absl::StrCat("devices[", i, "]")));
    for (size_t j = 0; j < i; ++j) {
      if (devices[j] == devices[i]) {
        return absl::InvalidArgumentError(absl::StrCat("devices[", i, "] = ", devices[i],
                                                       " repeats devices[", j,
                                                       "] (NCCL takes one rank per GPU)"));
      }
    }
  }
  const int world = static_cast<int>(devices.size());
  ncclUniqueId id;
  MT_RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId", 0, ""));

  // ncclCommInitAll, but with a config: one ncclCommInitRankConfig per device in one group.
  std::vector<ncclComm_t> raw(devices.size(), nullptr);
  std::vector<ncclConfig_t> configs(devices.size(), NonBlockingConfig());
  absl::Status status;
  {
    CurrentDeviceRestorer restore;
    MT_RETURN_IF_ERROR(NcclStatus(ncclGroupStart(), "ncclGroupStart", 0, ""));
    for (int r = 0; r < world && status.ok(); ++r) {
      status = CudaStatus(cudaSetDevice(devices[r]), absl::StrCat("cudaSetDevice(", devices[r], ")"));
      if (status.ok()) {
        const ncclResult_t result = ncclCommInitRankConfig(&raw[r], world, id, r, &configs[r]);
        if (result != ncclSuccess && result != ncclInProgress) {
          status = NcclStatus(result, "ncclCommInitRankConfig", r, ncclGetLastError(nullptr));
        }
      }
    }
    const ncclResult_t end = ncclGroupEnd();
    if (status.ok() && end != ncclSuccess && end != ncclInProgress) {
      status = NcclStatus(end, "ncclGroupEnd (ncclCommInitRankConfig)", 0,
                          ncclGetLastError(nullptr));
    }
  }
  std::vector<NcclCommunicator> ranks;
  ranks.reserve(devices.size());
  for (int r = 0; r < world; ++r) {
    ranks.push_back(NcclCommunicator(raw[r], r, world, devices[r], options));
  }
  if (!status.ok()) return status;  // the vector aborts every communicator that was made
  for (NcclCommunicator& rank : ranks) {
    if (rank.comm_ == nullptr) {
      return absl::InternalError(absl::StrCat("rank ", rank.rank_,
                                              ": ncclCommInitRankConfig made no communicator"));
    }
    MT_RETURN_IF_ERROR(rank.Settle(ncclInProgress, "ncclCommInitRankConfig", options.init_timeout));
  }
  return ranks;
}

absl::StatusOr<NcclCommunicator> NcclCommunicator::CreateOverHost(Communicator& host, int device,
                                                                  const NcclOptions& options) {
  absl::StatusOr<int> device_count = CudaDeviceCount();
  if (!device_count.ok()) return device_count.status();
  MT_RETURN_IF_ERROR(CheckDevice(device, *device_count, "device"));
  UniqueIdMessage message;
  std::memset(&message, 0, sizeof(message));
  absl::Status made;
  if (host.rank() == 0) {
    made = NcclStatus(ncclGetUniqueId(&message.id), "ncclGetUniqueId", 0, "");
    message.ok = made.ok() ? 1 : 0;
  }
  // Every rank takes part in the broadcast, rank 0 even when it failed, so no rank waits alone.
  MT_RETURN_IF_ERROR(host.Broadcast(&message, sizeof(message), 0));
  MT_RETURN_IF_ERROR(made);
  if (message.ok != 1) {
    return absl::UnavailableError(absl::StrCat(
        "rank ", host.rank(), ": host rank 0 could not make the ncclUniqueId (see its error)"));
  }

  CurrentDeviceRestorer restore;
  MT_RETURN_IF_ERROR(
      CudaStatus(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")")));
  ncclConfig_t config = NonBlockingConfig();
  ncclComm_t comm = nullptr;
  const ncclResult_t result =
      ncclCommInitRankConfig(&comm, host.size(), message.id, host.rank(), &config);
  NcclCommunicator rank(comm, host.rank(), host.size(), device, options);
  if (comm == nullptr && (result == ncclSuccess || result == ncclInProgress)) {
    return absl::InternalError(absl::StrCat("rank ", host.rank(),
                                            ": ncclCommInitRankConfig made no communicator"));
  }
  if (comm == nullptr) return rank.Fail(result, "ncclCommInitRankConfig");
  MT_RETURN_IF_ERROR(rank.Settle(result, "ncclCommInitRankConfig", options.init_timeout));
  return rank;
}

absl::Status NcclCommunicator::ReduceScatterSum(const float* send, float* shard,
                                                size_t shard_elements, cudaStream_t stream) {
  MT_RETURN_IF_ERROR(CheckUsable("ncclReduceScatter"));
  if (shard_elements > 0 && (send == nullptr || shard == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank_, ": ncclReduceScatter: send or shard is null for shard_elements ",
        shard_elements));
  }
  return Settle(ncclReduceScatter(send, shard, shard_elements, ncclFloat32, ncclSum, comm_, stream),
                "ncclReduceScatter", options_.collective_timeout);
}

absl::Status NcclCommunicator::AllGather(const void* shard, void* gathered, size_t shard_elements,
                                         NcclElement element, cudaStream_t stream) {
  MT_RETURN_IF_ERROR(CheckUsable("ncclAllGather"));
  if (shard_elements > 0 && (shard == nullptr || gathered == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank_, ": ncclAllGather: shard or gathered is null for shard_elements ",
        shard_elements));
  }
  return Settle(
      ncclAllGather(shard, gathered, shard_elements, NcclType(element), comm_, stream),
      "ncclAllGather", options_.collective_timeout);
}

absl::Status NcclCommunicator::AllReduceSum(const float* send, float* recv, size_t n,
                                            cudaStream_t stream) {
  MT_RETURN_IF_ERROR(CheckUsable("ncclAllReduce"));
  if (n > 0 && (send == nullptr || recv == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank_, ": ncclAllReduce: send or recv is null for n ", n));
  }
  return Settle(ncclAllReduce(send, recv, n, ncclFloat32, ncclSum, comm_, stream),
                "ncclAllReduce", options_.collective_timeout);
}

absl::Status NcclCommunicator::Broadcast(const void* send, void* recv, size_t bytes, int root,
                                         cudaStream_t stream) {
  MT_RETURN_IF_ERROR(CheckUsable("ncclBroadcast"));
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank_, ": ncclBroadcast: root ", root,
                                                   " is not a rank of a world of ", size_));
  }
  if (bytes > 0 && (recv == nullptr || (rank_ == root && send == nullptr))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank_, ": ncclBroadcast: send or recv is null for bytes ", bytes));
  }
  return Settle(ncclBroadcast(send, recv, bytes, ncclUint8, root, comm_, stream),
                "ncclBroadcast", options_.collective_timeout);
}

absl::Status NcclCommunicator::Synchronize(cudaStream_t stream) {
  MT_RETURN_IF_ERROR(CheckUsable("Synchronize"));
  const absl::Time deadline = absl::Now() + options_.collective_timeout;
  while (true) {
    const cudaError_t query = cudaStreamQuery(stream);
    if (query != cudaSuccess && query != cudaErrorNotReady) {
      return CudaStatus(query, absl::StrCat("rank ", rank_, ": cudaStreamQuery"));
    }
    ncclResult_t state = ncclSuccess;
    const ncclResult_t got = ncclCommGetAsyncError(comm_, &state);
    if (got != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
      absl::Status status = Fail(got != ncclSuccess ? got : state, "Synchronize");
      Abort();
      return status;
    }
    if (query == cudaSuccess) return absl::OkStatus();
    if (absl::Now() >= deadline) break;
    absl::SleepFor(options_.poll_interval);
  }
  // A peer never came: abort, which ends this rank's kernels, and say whether the stream drained.
  Abort();
  const absl::Time drain_deadline = absl::Now() + options_.collective_timeout;
  cudaError_t drained = cudaStreamQuery(stream);
  while (drained == cudaErrorNotReady && absl::Now() < drain_deadline) {
    absl::SleepFor(options_.poll_interval);
    drained = cudaStreamQuery(stream);
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "rank ", rank_, ": the stream's collectives did not finish within ",
      absl::FormatDuration(options_.collective_timeout),
      " (a peer is dead or never made the same call); the NCCL communicator was aborted and the "
      "stream ",
      drained == cudaSuccess ? "drained" : absl::StrCat("did not drain: ", cudaGetErrorString(drained))));
}

absl::Status NcclGroup(absl::Span<NcclCommunicator* const> ranks,
                       absl::FunctionRef<absl::Status()> calls) {
  if (ranks.empty()) return calls();
  for (NcclCommunicator* rank : ranks) MT_RETURN_IF_ERROR(rank->CheckUsable("NcclGroup"));
  MT_RETURN_IF_ERROR(NcclStatus(ncclGroupStart(), "ncclGroupStart", ranks.front()->rank(), ""));
  for (NcclCommunicator* rank : ranks) rank->in_group_ = true;
  absl::Status status = calls();
  const ncclResult_t end = ncclGroupEnd();
  for (NcclCommunicator* rank : ranks) rank->in_group_ = false;
  if (!status.ok()) {
    for (NcclCommunicator* rank : ranks) rank->Abort();
    return status;
  }
  for (NcclCommunicator* rank : ranks) {
    absl::Status settled = rank->Settle(end, "ncclGroupEnd", rank->options_.collective_timeout);
    if (!settled.ok() && status.ok()) status = settled;
  }
  if (!status.ok()) {
    for (NcclCommunicator* rank : ranks) rank->Abort();
  }
  return status;
}

absl::Status NcclClose(absl::Span<NcclCommunicator* const> ranks) {
  std::vector<NcclCommunicator*> open;
  for (NcclCommunicator* rank : ranks) {
    if (rank->comm_ != nullptr) open.push_back(rank);
  }
  if (open.empty()) return absl::OkStatus();
  absl::Status status;
  const ncclResult_t start = ncclGroupStart();
  if (start != ncclSuccess) {
    status = NcclStatus(start, "ncclGroupStart", open.front()->rank(), "");
  } else {
    std::vector<ncclResult_t> finalized;
    for (NcclCommunicator* rank : open) finalized.push_back(ncclCommFinalize(rank->comm_));
    const ncclResult_t end = ncclGroupEnd();
    for (size_t i = 0; i < open.size(); ++i) {
      const ncclResult_t result = finalized[i] != ncclSuccess ? finalized[i] : end;
      absl::Status settled =
          open[i]->Settle(result, "ncclCommFinalize", open[i]->options_.collective_timeout);
      if (!settled.ok() && status.ok()) status = settled;
    }
  }
  for (NcclCommunicator* rank : open) {
    if (rank->comm_ == nullptr) continue;  // aborted above
    if (!status.ok()) {
      rank->Abort();
      continue;
    }
    // Local once finalized; a non-blocking communicator may report ncclInProgress while NCCL
    // frees it in the background (the handle is not ours to poll after this call).
    const ncclResult_t destroyed = ncclCommDestroy(rank->comm_);
    rank->comm_ = nullptr;
    if (destroyed != ncclSuccess && destroyed != ncclInProgress && status.ok()) {
      status = NcclStatus(destroyed, "ncclCommDestroy", rank->rank(), "");
    }
  }
  return status;
}

}  // namespace megatrain::engine::dist
