// Run under mpirun by nccl_mpi_test.sh: one NCCL rank per process on its own GPU, the
// ncclUniqueId sent over MpiCommunicator; every collective against the double host reference
// (each rank computes every rank's inputs), the all-reduce's bits the same on every rank, and a
// peer that never calls (rank 0 must fail with DEADLINE_EXCEEDED). Prints "rank R of W: nccl
// collectives ok" and exits 0, or "skipped: ..." and exits 0 with fewer GPUs than ranks (two
// ranks cannot share a GPU in NCCL), or FAIL and exits 1.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/dist/mpi_communicator.h"
#include "engine/dist/nccl_communicator.h"
#include "engine/dist/nccl_test_values.h"
#include "kernels/common/bf16.h"

namespace megatrain::engine::dist {
namespace {

using kernels::Float32ToBf16Bits;
using testing::Contribution;

// Device memory on the current device (the rank's GPU), freed at scope end.
class DeviceBytes {
 public:
  explicit DeviceBytes(size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&ptr_, bytes_ == 0 ? 1 : bytes_) != cudaSuccess) ptr_ = nullptr;
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  ~DeviceBytes() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  void* get() const { return ptr_; }
  absl::Status Upload(const void* host) const {
    if (ptr_ == nullptr) return absl::ResourceExhaustedError("cudaMalloc failed");
    if (cudaMemcpy(ptr_, host, bytes_, cudaMemcpyHostToDevice) != cudaSuccess) {
      return absl::InternalError("cudaMemcpy to the device failed");
    }
    return absl::OkStatus();
  }
  absl::Status Download(void* host) const {
    if (cudaMemcpy(host, ptr_, bytes_, cudaMemcpyDeviceToHost) != cudaSuccess) {
      return absl::InternalError("cudaMemcpy from the device failed");
    }
    return absl::OkStatus();
  }

 private:
  size_t bytes_;
  void* ptr_ = nullptr;
};

uint64_t Fnv1a(const void* data, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

absl::Status CheckAllReduce(MpiCommunicator& host, NcclCommunicator& nccl, cudaStream_t stream,
                            size_t n) {
  const std::vector<float> x = Contribution(host.rank(), n);
  DeviceBytes data(n * sizeof(float));
  MT_RETURN_IF_ERROR(data.Upload(x.data()));
  float* device = static_cast<float*>(data.get());
  MT_RETURN_IF_ERROR(nccl.AllReduceSum(device, device, n, stream));
  MT_RETURN_IF_ERROR(nccl.Synchronize(stream));
  std::vector<float> got(n);
  MT_RETURN_IF_ERROR(data.Download(got.data()));
  const int64_t miss = testing::FirstMiss(got, testing::SumOverRanks(host.size(), n), 0);
  if (miss >= 0) {
    return absl::InternalError(
        absl::StrCat("rank ", host.rank(), ": all-reduce of n=", n, " off at ", miss));
  }
  // Every rank the same bits: the hash's halves are exact as doubles.
  const uint64_t h = Fnv1a(got.data(), n * sizeof(float));
  const double halves[2] = {static_cast<double>(h >> 32), static_cast<double>(h & 0xffffffffu)};
  absl::StatusOr<std::vector<double>> all = host.AllGatherDoubles(halves);
  if (!all.ok()) return all.status();
  for (int r = 0; r < host.size(); ++r) {
    if ((*all)[2 * r] != halves[0] || (*all)[2 * r + 1] != halves[1]) {
      return absl::InternalError(absl::StrCat("rank ", host.rank(), ": all-reduce of n=", n,
                                              " gave other bits than rank ", r));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckReduceScatterAndAllGather(MpiCommunicator& host, NcclCommunicator& nccl,
                                            cudaStream_t stream, size_t n) {
  const int w = host.size();
  const size_t shard = NcclShardElements(n, w);
  std::vector<float> x = Contribution(host.rank(), n);
  x.resize(shard * static_cast<size_t>(w), 0.0f);
  DeviceBytes send(x.size() * sizeof(float));
  DeviceBytes mine(shard * sizeof(float));
  MT_RETURN_IF_ERROR(send.Upload(x.data()));
  MT_RETURN_IF_ERROR(nccl.ReduceScatterSum(static_cast<const float*>(send.get()),
                                           static_cast<float*>(mine.get()), shard, stream));
  MT_RETURN_IF_ERROR(nccl.Synchronize(stream));
  std::vector<float> got(shard);
  MT_RETURN_IF_ERROR(mine.Download(got.data()));
  const size_t offset = static_cast<size_t>(host.rank()) * shard;
  const int64_t miss = testing::FirstMiss(got, testing::SumOverRanks(w, n), offset);
  if (miss >= 0) {
    return absl::InternalError(absl::StrCat("rank ", host.rank(), ": reduce-scatter of n=", n,
                                            " off at ", offset + static_cast<size_t>(miss)));
  }
  // bf16 shards gathered back in rank order, bit for bit.
  std::vector<uint16_t> shard16(shard);
  const std::vector<float> own = Contribution(host.rank(), shard);
  for (size_t i = 0; i < shard; ++i) shard16[i] = Float32ToBf16Bits(own[i]);
  DeviceBytes shard_device(shard * sizeof(uint16_t));
  DeviceBytes gathered(shard * static_cast<size_t>(w) * sizeof(uint16_t));
  MT_RETURN_IF_ERROR(shard_device.Upload(shard16.data()));
  MT_RETURN_IF_ERROR(nccl.AllGather(shard_device.get(), gathered.get(), shard,
                                    NcclElement::kBfloat16, stream));
  MT_RETURN_IF_ERROR(nccl.Synchronize(stream));
  std::vector<uint16_t> all(shard * static_cast<size_t>(w));
  MT_RETURN_IF_ERROR(gathered.Download(all.data()));
  for (int r = 0; r < w; ++r) {
    const std::vector<float> theirs = Contribution(r, shard);
    for (size_t i = 0; i < shard; ++i) {
      if (all[static_cast<size_t>(r) * shard + i] != Float32ToBf16Bits(theirs[i])) {
        return absl::InternalError(absl::StrCat("rank ", host.rank(), ": all-gather of shard ",
                                                shard, ": rank ", r, "'s element ", i));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckBroadcast(MpiCommunicator& host, NcclCommunicator& nccl, cudaStream_t stream) {
  const int root = host.size() - 1;
  const size_t bytes = 3001;
  std::vector<unsigned char> data(bytes, 0);
  if (host.rank() == root) {
    for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<unsigned char>(i * 7);
  }
  DeviceBytes device(bytes);
  MT_RETURN_IF_ERROR(device.Upload(data.data()));
  MT_RETURN_IF_ERROR(nccl.Broadcast(device.get(), device.get(), bytes, root, stream));
  MT_RETURN_IF_ERROR(nccl.Synchronize(stream));
  MT_RETURN_IF_ERROR(device.Download(data.data()));
  for (size_t i = 0; i < bytes; ++i) {
    if (data[i] != static_cast<unsigned char>(i * 7)) {
      return absl::InternalError(absl::StrCat("rank ", host.rank(), ": broadcast byte ", i));
    }
  }
  return absl::OkStatus();
}

// Rank 0 calls an all-reduce that no other rank joins: it must fail with DEADLINE_EXCEEDED and
// abort; the others then abort too (their peer is gone).
absl::Status CheckDeadPeer(MpiCommunicator& host, NcclCommunicator& nccl, cudaStream_t stream) {
  if (host.rank() == 0) {
    DeviceBytes data(1001 * sizeof(float));
    float* device = static_cast<float*>(data.get());
    absl::Status status = nccl.AllReduceSum(device, device, 1001, stream);
    if (status.ok()) status = nccl.Synchronize(stream);
    if (status.code() != absl::StatusCode::kDeadlineExceeded || nccl.usable()) {
      return absl::InternalError(absl::StrCat(
          "rank 0: an all-reduce without peers gave '", status.ToString(), "', usable ",
          nccl.usable(), "; want DEADLINE_EXCEEDED and an aborted communicator"));
    }
  }
  MT_RETURN_IF_ERROR(host.Barrier());
  nccl.Abort();
  return absl::OkStatus();
}

absl::Status CheckAll(MpiCommunicator& host, int device) {
  NcclOptions options;
  options.init_timeout = absl::Seconds(60);
  options.collective_timeout = absl::Seconds(10);
  absl::StatusOr<NcclCommunicator> made = NcclCommunicator::CreateOverHost(host, device, options);
  if (!made.ok()) return made.status();
  NcclCommunicator& nccl = *made;
  if (nccl.rank() != host.rank() || nccl.size() != host.size()) {
    return absl::InternalError(absl::StrCat("rank ", host.rank(), ": NCCL rank ", nccl.rank(),
                                            " of ", nccl.size()));
  }
  // CreateOverHost leaves the caller's current device as it was; the buffers belong on ours.
  if (cudaSetDevice(device) != cudaSuccess) {
    return absl::InternalError(absl::StrCat("rank ", host.rank(), ": cudaSetDevice(", device, ")"));
  }
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    return absl::InternalError("cudaStreamCreateWithFlags failed");
  }
  absl::Status status;
  for (const size_t n : {size_t{1}, size_t{7}, size_t{4097}, (size_t{1} << 20) + 3}) {
    if (status.ok()) status = CheckAllReduce(host, nccl, stream, n);
    if (status.ok()) status = CheckReduceScatterAndAllGather(host, nccl, stream, n);
  }
  if (status.ok()) status = CheckBroadcast(host, nccl, stream);
  if (status.ok()) status = CheckDeadPeer(host, nccl, stream);
  cudaStreamDestroy(stream);
  return status;
}

}  // namespace
}  // namespace megatrain::engine::dist

int main() {
  using megatrain::engine::dist::MpiCommunicator;
  absl::StatusOr<std::unique_ptr<MpiCommunicator>> host = MpiCommunicator::Create();
  if (!host.ok()) {
    std::fprintf(stderr, "FAIL %s\n", std::string(host.status().message()).c_str());
    return 1;
  }
  const int rank = (*host)->rank();
  const int world = (*host)->size();
  int gpus = 0;
  const cudaError_t counted = cudaGetDeviceCount(&gpus);
  // Every rank sees the same machine, so every rank takes the same branch.
  if (counted != cudaSuccess || gpus == 0) {
    std::printf("rank %d of %d: skipped: no CUDA device (%s)\n", rank, world,
                counted != cudaSuccess ? cudaGetErrorString(counted) : "device count is 0");
    return 0;
  }
  if (gpus < world) {
    std::printf("rank %d of %d: skipped: needs %d GPUs (one per rank), found %d\n", rank, world,
                world, gpus);
    return 0;
  }
  const absl::Status s = megatrain::engine::dist::CheckAll(**host, rank);
  if (!s.ok()) {
    std::fprintf(stderr, "FAIL %s\n", s.ToString().c_str());
    (*host)->Abort(1);
  }
  std::printf("rank %d of %d: nccl collectives ok\n", rank, world);
  return 0;
}
