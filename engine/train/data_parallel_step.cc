// Combining the ranks' counts, loss sums and gradients (see data_parallel_step.h).
#include "engine/train/data_parallel_step.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace megatrain::engine {

absl::StatusOr<RankSlots> RankSlotsOf(int accumulation, int rank, int world) {
  if (world < 1 || accumulation < 1 || accumulation % world != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "grad_accumulation=", accumulation, " must be a positive multiple of the data-parallel ",
        "world size ", world, " (each rank runs accumulation / world micro-batches)"));
  }
  const int per_rank = accumulation / world;
  return RankSlots{rank * per_rank, per_rank};
}

absl::StatusOr<int64_t> GlobalValidTargets(dist::Communicator& comm, int64_t local_valid) {
  return comm.SumInt64(local_valid);
}

absl::StatusOr<double> GlobalLossSum(dist::Communicator& comm, double local_loss_sum) {
  absl::StatusOr<std::vector<double>> sums = comm.AllGatherDoubles({local_loss_sum});
  if (!sums.ok()) return sums.status();
  double total = 0;  // 0 + l0 is l0 exactly: the single process's sum starts from zero too
  for (double s : *sums) total += s;
  return total;
}

absl::Status ReduceGradientsInRankOrder(dist::Communicator& comm, ParameterStore& store) {
  for (int e = 0; e < store.num_entries(); ++e) {
    const EntryBuffers b = store.entry(e);
    if (b.grad == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("data parallelism needs gradients in RAM; entry ", e,
                       "'s gradient is on NVMe (grad_on_nvme or a RAM budget that overflows)"));
    }
    if (absl::Status s = comm.ReduceFloatsInRankOrder(b.grad, b.elements); !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("reducing entry ", e, "'s gradient: ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace megatrain::engine
