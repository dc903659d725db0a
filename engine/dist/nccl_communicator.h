// NcclCommunicator: one NCCL rank's collectives over device buffers on a CUDA stream, for data
// parallelism across GPUs (docs/scale_out.md, "GPUs: NCCL"). A world is either every listed GPU
// of this process (CreateForDevices: the daemon's N GPUs, driven by one thread in NcclGroup) or
// one rank per process (CreateOverHost: the ncclUniqueId travels over the host Communicator,
// e.g. MpiCommunicator).
//
// What is bitwise and what is not:
// - AllGather and Broadcast copy bytes: bitwise, always.
// - ReduceScatterSum and AllReduceSum add in NCCL's order (ring, tree or NVLS, chosen per size by
//   NCCL's tuner), not in rank order. For a fixed topology, world, NCCL version, message size
//   and environment the order is fixed, so a run is reproducible, and every rank of an
//   AllReduceSum gets the same bits. It is NOT the bits of accumulation ((g0 + g1) + g2) that
//   the CPU path's Communicator::ReduceFloatsInRankOrder reproduces: GPU data parallelism
//   matches one process with accumulation to within fp32 rounding (W - 1 additions per
//   element), not bit for bit. Launch with NCCL_ALGO=Ring NCCL_PROTO=Simple to pin the
//   algorithm for every size (the tuner's choice then no longer depends on the message size or
//   on NVLink SHARP); this class sets no environment (process-wide state is the launcher's).
//
// Failure: communicators are non-blocking (ncclConfig_t.blocking = 0), so no NCCL call and no
// wait here blocks past its deadline. Every call is followed by polling ncclCommGetAsyncError;
// Synchronize polls the stream and the communicator. A peer that is dead or never joins makes
// the call fail with DEADLINE_EXCEEDED after `collective_timeout` (`init_timeout` while
// connecting) and the communicator is aborted (ncclCommAbort): issue 18's fault point for GPUs.
// A closed or aborted communicator refuses further calls with FAILED_PRECONDITION.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/dist/communicator.h"

struct ncclComm;  // nccl.h's opaque communicator (ncclComm_t is ncclComm*)

namespace megatrain::engine::dist {

// Element types of AllGather: the compute copy's bf16 or fp32 shards.
enum class NcclElement { kFloat32, kBfloat16 };

struct NcclOptions {
  // Creating the world: every rank must join within this time.
  absl::Duration init_timeout = absl::Minutes(2);
  // Each call's enqueueing and each Synchronize: a layer's gradients over a slow link take
  // seconds, a peer that died never finishes.
  absl::Duration collective_timeout = absl::Minutes(2);
  // How often a wait looks at the stream and the communicator's error state.
  absl::Duration poll_interval = absl::Milliseconds(1);
};

// Elements of each rank's shard when n elements are split over `world` ranks: ceil(n / world).
// ReduceScatterSum and AllGather take shard * world elements, so a tensor whose size does not
// divide is padded to that (the padding's sums are ignored).
size_t NcclShardElements(size_t n, int world);

class NcclCommunicator {
 public:
  // One communicator per entry of `devices` (CUDA ordinals, distinct), rank i on devices[i]; the
  // ncclCommInitAll of this process's GPUs, made non-blocking. INVALID_ARGUMENT for an empty
  // list or a bad ordinal, naming it.
  static absl::StatusOr<std::vector<NcclCommunicator>> CreateForDevices(
      absl::Span<const int> devices, const NcclOptions& options);
  // This process's rank of host.size() ranks, on CUDA device `device`: host rank 0 makes the
  // ncclUniqueId and host.Broadcast hands it to the others (each process calls this together).
  // A world of one (SingleProcessCommunicator) is legal.
  static absl::StatusOr<NcclCommunicator> CreateOverHost(Communicator& host, int device,
                                                         const NcclOptions& options);

  NcclCommunicator(NcclCommunicator&& other) noexcept;
  NcclCommunicator& operator=(NcclCommunicator&& other) noexcept;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;
  // Aborts a communicator not yet closed: closing waits for the peers, which a destructor must
  // not (the other ranks of this process may be destroyed after it); call NcclClose first.
  ~NcclCommunicator();

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  // False once closed or aborted.
  bool usable() const { return comm_ != nullptr; }

  // The collectives enqueue on `stream` (a stream of device()) and return once enqueued; call
  // Synchronize(stream) (or order later work on the stream) before reading the results. Every
  // rank must make the same calls in the same order; inside NcclGroup when one thread drives
  // several ranks. Buffers are device memory of device().
  //
  // send[0, shard * size()) of every rank, summed over ranks (fp32): this rank's
  // shard[0, shard) gets elements [rank * shard, (rank + 1) * shard) of the sum. A layer's
  // gradient becomes 1/size() of it per device before it leaves the device.
  absl::Status ReduceScatterSum(const float* send, float* shard, size_t shard_elements,
                                cudaStream_t stream);
  // Every rank's shard[0, shard_elements) (the same count everywhere) concatenated in rank order
  // into gathered[0, shard_elements * size()): the updated compute copy back on every device.
  absl::Status AllGather(const void* shard, void* gathered, size_t shard_elements,
                         NcclElement element, cudaStream_t stream);
  // recv[0, n) = the sum over ranks of send[0, n) (fp32; send == recv is allowed).
  absl::Status AllReduceSum(const float* send, float* recv, size_t n, cudaStream_t stream);
  // `bytes` from rank `root`'s send to every rank's recv (root's own too; send is read only on
  // root, send == recv is allowed).
  absl::Status Broadcast(const void* send, void* recv, size_t bytes, int root,
                         cudaStream_t stream);

  // Waits until `stream` has run out, polling NCCL's asynchronous error state meanwhile. After
  // collective_timeout (or an NCCL error) the communicator is aborted, which ends its kernels,
  // and the error says so (DEADLINE_EXCEEDED for a timeout).
  absl::Status Synchronize(cudaStream_t stream);

  // NcclClose of this rank alone (a world of one process per rank).
  absl::Status Close();
  // Ends every operation of this communicator still running and frees it (ncclCommAbort). The
  // other ranks' pending collectives then fail or time out on their side.
  void Abort();

 private:
  friend absl::Status NcclGroup(absl::Span<NcclCommunicator* const> ranks,
                                absl::FunctionRef<absl::Status()> calls);
  friend absl::Status NcclClose(absl::Span<NcclCommunicator* const> ranks);
  NcclCommunicator(ncclComm* comm, int rank, int size, int device, const NcclOptions& options);
  // Refuses calls on an aborted communicator.
  absl::Status CheckUsable(const char* call) const;
  // The status of an NCCL call that returned `result`; for ncclInProgress (or success) waits
  // until the communicator settles or the deadline passes; aborts on an error or a timeout.
  absl::Status Settle(int result, const char* call, absl::Duration timeout);
  absl::Status Fail(int result, const char* call);

  ncclComm* comm_ = nullptr;
  int rank_ = 0;
  int size_ = 0;
  int device_ = 0;
  NcclOptions options_;
  // Set by NcclGroup while its calls run: NCCL defers them to ncclGroupEnd, so there is nothing
  // to wait for per call.
  bool in_group_ = false;
};

// Runs `calls` (collectives of the ranks in `ranks`, all of this process) as one NCCL group
// (ncclGroupStart ... ncclGroupEnd), then waits for each rank's communicator to settle. One
// thread driving several GPUs must group their collectives, or the first rank's call would wait
// for peers that the same thread has not called yet. When `calls` fails the group is still
// closed and every rank of it is aborted (a partial group cannot be undone).
absl::Status NcclGroup(absl::Span<NcclCommunicator* const> ranks,
                       absl::FunctionRef<absl::Status()> calls);

// Flushes and frees the communicators of `ranks` (this process's ranks of one world, or this
// process's only rank): ncclCommFinalize of all of them as one group, a wait of
// collective_timeout for them to settle (all ranks of the world close together), then
// ncclCommDestroy. A rank that does not settle is aborted and the first error returned. Closed
// and aborted communicators are skipped.
absl::Status NcclClose(absl::Span<NcclCommunicator* const> ranks);

}  // namespace megatrain::engine::dist
