// MpiCommunicator: the Communicator over Open MPI's MPI_COMM_WORLD, for ranks launched by mpirun
// (docs/scale_out.md). Owns MPI's lifetime: Create initializes MPI, the destructor finalizes it;
// at most one per process. Errors come back as absl::Status naming the rank and the MPI call.
#pragma once

#include <memory>

#include "engine/dist/communicator.h"

namespace megatrain::engine::dist {

// Whether this process was started by an MPI launcher (mpirun sets OMPI_COMM_WORLD_SIZE, PMIx
// launchers such as srun PMIX_RANK).
bool LaunchedByMpi();

class MpiCommunicator final : public Communicator {
 public:
  // Initializes MPI (MPI_THREAD_FUNNELED: only the thread that made it calls it).
  // FAILED_PRECONDITION when MPI is already initialized in this process.
  static absl::StatusOr<std::unique_ptr<MpiCommunicator>> Create();
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
  // Pieces of kRootPieceFloats: an MPI_Gather brings root every rank's piece, in rank order, and
  // root sums them (SumInRankOrder).
  absl::Status ReduceFloatsInRankOrderTo(float* data, size_t n, int root) override;
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  absl::Status Barrier() override;
  CommunicatorStats stats() const override { return stats_; }
  // Ends every rank of the job with `exit_code` (MPI_Abort): for a rank that fails while the
  // others wait in a collective, where returning would leave them blocked.
  [[noreturn]] void Abort(int exit_code);

  // Floats per all-to-all round: bounds the receive buffer (one piece) and keeps MPI's int
  // counts in range.
  static constexpr size_t kPieceFloats = size_t{1} << 22;
  // Floats per gather round of ReduceFloatsInRankOrderTo: root's receive buffer is world pieces.
  static constexpr size_t kRootPieceFloats = size_t{1} << 20;

 private:
  MpiCommunicator(int rank, int size) : rank_(rank), size_(size) {}
  absl::Status Check(int code, const char* call) const;
  int rank_;
  int size_;
  CommunicatorStats stats_;
  std::vector<float> receive_;  // one piece of every rank's contributions to the owned range
};

}  // namespace megatrain::engine::dist
