// MpiCommunicator: the Communicator over Open MPI's MPI_COMM_WORLD, for ranks launched by mpirun
// (docs/scale_out.md). Owns MPI's lifetime: Create initializes MPI, the destructor finalizes it;
// at most one per process. Errors come back as absl::Status naming the rank and the MPI call.
// Every collective has a deadline (MpiCommunicatorOptions::collective_timeout): a call that has
// not completed by then (a rank stopped or hung) prints which rank, host, collective and step
// waited, and ends the whole job with MPI_Abort.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "engine/dist/collective_watchdog.h"
#include "engine/dist/communicator.h"

namespace megatrain::engine::dist {

// Whether this process was started by an MPI launcher (mpirun sets OMPI_COMM_WORLD_SIZE, PMIx
// launchers such as srun PMIX_RANK).
bool LaunchedByMpi();

struct MpiCommunicatorOptions {
  // How long one collective call may wait for the other ranks before this rank ends the job
  // (MPI_Abort, every rank exits, mpirun non-zero). It must exceed the longest gap between ranks
  // arriving at a collective: a step's compute imbalance, rank 0 writing a checkpoint's model
  // and manifest while the others wait. 0 = wait forever.
  std::chrono::seconds collective_timeout{300};
};

class MpiCommunicator final : public Communicator {
 public:
  // Initializes MPI (MPI_THREAD_SERIALIZED: calls come from one thread at a time, the one that
  // made it, or a device's stream thread running a reduce-scatter while that one waits; the
  // watchdog's thread calls nothing but MPI_Abort, possibly while another thread is inside a
  // collective: strictly MPI_THREAD_MULTIPLE's territory, relied on as before, when that thread
  // was the one that made it). FAILED_PRECONDITION when MPI is already
  // initialized in this process; UNAVAILABLE when MPI cannot give that thread level;
  // INVALID_ARGUMENT for a negative timeout.
  static absl::StatusOr<std::unique_ptr<MpiCommunicator>> Create(
      const MpiCommunicatorOptions& options = {});
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::StatusOr<int64_t> SumInt64(int64_t value) override;
  absl::StatusOr<std::vector<double>> AllGatherDoubles(absl::Span<const double> values) override;
  // Each rank owns a contiguous range (OwnedRangeOf) of every piece of at most kPieceFloats:
  // an all-to-all brings it every rank's contribution to its range, it sums them in rank order
  // (SumInRankOrder), and an all-gather gives everyone the sums.
  absl::Status ReduceFloatsInRankOrder(float* data, size_t n) override;
  // Pieces of kRootPieceFloats: an MPI_Gatherv brings root every rank's piece, in rank order, and
  // root sums them (SumInRankOrder).
  absl::Status ReduceFloatsInRankOrderTo(float* data, size_t n, int root) override;
  // As ReduceFloatsInRankOrder and ...To, with each rank's two arrays going out per piece: every
  // owner (or root) receives 2W contributions, d_0, a_0, d_1, a_1, ..., and sums them in that
  // order.
  absl::Status ReduceFloatPairsInRankOrder(float* data, const float* apart, size_t n) override;
  absl::Status ReduceFloatPairsInRankOrderTo(float* data, const float* apart, size_t n,
                                             int root) override;
  // Pieces of at most kPieceFloats / size() floats of the shard: the ranks' blocks for it are
  // staged contiguously and exchanged with one MPI_Alltoall, then summed in rank order.
  absl::Status ReduceScatterFloatsInRankOrder(const float* send, float* recv,
                                              size_t shard) override;
  // Pieces the same way, with one MPI_Allgather each.
  absl::Status AllGatherFloatShards(float* data, size_t n) override;
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  absl::Status Barrier() override;
  CommunicatorStats stats() const override { return stats_; }
  void NoteStep(uint64_t step) override { watchdog_->NoteStep(step); }
  const std::string& host() const { return host_; }
  // This rank among the ranks on its machine (MPI_COMM_TYPE_SHARED, ordered by world rank), and
  // how many there are: which of the machine's GPUs are this rank's (RankFirstDevice).
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  // Ends every rank of the job with `exit_code` (MPI_Abort): for a rank that fails while the
  // others wait in a collective, where returning would leave them blocked.
  [[noreturn]] void Abort(int exit_code);

  // Floats per all-to-all round: bounds the receive buffer (one piece) and keeps MPI's int
  // counts in range.
  static constexpr size_t kPieceFloats = size_t{1} << 22;
  // Floats per gather round of ReduceFloatsInRankOrderTo: root's receive buffer is world pieces.
  static constexpr size_t kRootPieceFloats = size_t{1} << 20;

 private:
  MpiCommunicator(int rank, int size, std::string host)
      : rank_(rank), size_(size), host_(std::move(host)) {}
  absl::Status Check(int code, const char* call) const;
  // The reductions, with one contribution per rank (apart null) or two (data, then apart).
  absl::Status ReduceInRankOrder(float* data, const float* apart, size_t n);
  absl::Status ReduceInRankOrderTo(float* data, const float* apart, size_t n, int root);
  // Prints which rank, host, collective and step waited too long, and aborts the job.
  [[noreturn]] void AbortOverdue(const CollectiveWatchdog::Overdue& overdue);
  int rank_;
  int size_;
  std::string host_;
  int local_rank_ = 0;
  int local_size_ = 1;
  // Reports with the members above; the destructor joins its thread before MPI_Finalize.
  std::unique_ptr<CollectiveWatchdog> watchdog_;
  CommunicatorStats stats_;
  // One piece of every rank's contributions (one or two each) to the owned range, in rank order.
  std::vector<float> receive_;
  std::vector<float> staged_;  // this rank's blocks of one reduce-scatter or all-gather piece
};

}  // namespace megatrain::engine::dist
