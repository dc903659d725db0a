// The data-parallel parts of an optimizer step (docs/scale_out.md): each rank runs its own
// micro-batches, then these combine the ranks' valid-target counts, loss sums and gradients so
// that every rank holds what one process with all the micro-batches would, bit for bit when each
// rank runs one micro-batch (rank r = micro-batch slot r of an accumulation-W step). The
// optimizer pass that follows runs on every rank over the replicated state; the seam for ZeRO-1
// (each rank updating only its owned range of m and v, then an all-gather of the masters) is
// ReduceGradientsInRankOrder's owned ranges.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/dist/communicator.h"
#include "engine/exec/parameter_store.h"

namespace megatrain::engine {

// Which micro-batch slots of an accumulation-`accumulation` step rank `rank` of `world` runs:
// the contiguous slots [first, first + count). Every rank reads all the step's micro-batches, so
// the data cursor (and a checkpoint's) stays the global run's. Exact (bitwise accumulation's) when
// count is 1; with more, each rank adds its own first and the sum order differs. INVALID_ARGUMENT
// when accumulation is not a multiple of world.
struct RankSlots {
  int first = 0;
  int count = 0;
};
absl::StatusOr<RankSlots> RankSlotsOf(int accumulation, int rank, int world);

// OK when every rank runs the same job: `identity` (the job JSON and the step it starts from)
// hashes the same on every rank. Ranks that disagree would run different numbers of collectives
// and wait for each other forever; this is checked once, before the first step.
// FAILED_PRECONDITION naming the first rank that differs from rank 0.
absl::Status CheckSameJob(dist::Communicator& comm, const std::string& identity);

// The step's valid targets over every rank: each rank scales its loss by 1 / this, as a single
// process scales every micro-batch by 1 / the step's total.
absl::StatusOr<int64_t> GlobalValidTargets(dist::Communicator& comm, int64_t local_valid);

// The step's loss sum over every rank, added in rank order from zero: what a single process's
// `loss_sum += micro-batch sum` gives over the same micro-batches.
absl::StatusOr<double> GlobalLossSum(dist::Communicator& comm, double local_loss_sum);

// Every entry's gradient slab becomes the rank-ordered sum of the ranks' slabs (entry order,
// dist::Communicator::ReduceFloatsInRankOrder): the executor adds a step's micro-batch
// contributions into the slab in the same order, so the result is accumulation's. Gradients on
// NVMe are refused (FAILED_PRECONDITION naming the entry): not done yet.
absl::Status ReduceGradientsInRankOrder(dist::Communicator& comm, ParameterStore& store);

}  // namespace megatrain::engine
