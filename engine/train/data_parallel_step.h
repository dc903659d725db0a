// The data-parallel parts of an optimizer step (docs/scale_out.md): each rank runs its own
// micro-batches, then these combine the ranks' valid-target counts, loss sums and gradients so
// that every rank holds what one process with all the micro-batches would, bit for bit when each
// rank runs one micro-batch (rank r = micro-batch slot r of an accumulation-W step). Replicated:
// the optimizer pass then runs on every rank over the replicated state. ZeRO-1: each rank owns a
// range of every entry, gets its reduced gradient, updates it, and broadcasts its master.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/common/thread_pool.h"
#include "engine/dist/communicator.h"
#include "engine/exec/parameter_store.h"
#include "engine/exec/zero1_shards.h"

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

// Which of its machine's devices a rank drives: `devices_per_rank` consecutive ordinals from the
// one returned. The machine's ranks (local_rank of local_size, MpiCommunicator::local_rank) split
// the `visible` devices in local-rank order when there are enough for all of them. With fewer,
// a rank whose launcher restricted what it sees (`launcher_restricted`: CUDA_VISIBLE_DEVICES is
// set, per rank as `srun --gpus-per-task` does it, or for the whole job) starts at 0, and
// CheckDistinctGpus must then confirm that no two ranks got the same GPU; without a restriction
// every rank sees the same GPUs, so that would put two ranks on one: INVALID_ARGUMENT naming the
// numbers and what to change.
struct RankDevicesInputs {
  int local_rank = 0;
  int local_size = 1;
  int devices_per_rank = 1;
  int visible = 0;
  bool launcher_restricted = false;
};
absl::StatusOr<int> RankFirstDevice(const RankDevicesInputs& in);
// OK when no GPU is driven by two ranks (or twice by one): each rank passes the identities of the
// GPUs it drives (CUDA UUIDs, unique across machines), compared as fingerprints over `comm`.
// FAILED_PRECONDITION naming the ranks otherwise, or when ranks drive different numbers of GPUs.
absl::Status CheckDistinctGpus(dist::Communicator& comm, const std::vector<std::string>& gpu_ids);

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
// contributions into the slab in the same order, so the result is accumulation's. A gradient on
// NVMe is reduced chunk by chunk (staged, reduced, written back with its norm partials), so every
// rank's store must place and chunk its gradients alike (GradientLayoutFingerprint). An entry with
// its rows' gradient kept apart (a tied embedding, ParameterStore::rows_gradient) is reduced as
// pairs (Communicator::ReduceFloatPairsInRankOrder): the slab holds the LM head's gradient, the
// array apart the rows' scatter, which one process adds into the slab after it.
absl::Status ReduceGradientsInRankOrder(dist::Communicator& comm, ParameterStore& store);

// After a step whose devices reduce-scattered their gradients among the ranks (one device each,
// gradient_reduction devices or device_shards across processes): an entry with `shards[e]` holds
// in its slab only this rank's shard of the reduced sum, which an all-gather completes on every
// rank (Communicator::AllGatherFloatShards: byte copies); the others (the embedding's rows,
// summed on the host) hold the rank's own sum and are reduced in rank order as
// ReduceGradientsInRankOrder does. Every gradient must be in RAM (FAILED_PRECONDITION naming the
// entry otherwise).
absl::Status GatherReducedGradients(dist::Communicator& comm, ParameterStore& store,
                                    const std::vector<bool>& shards);

// Where the store keeps each entry's gradient and in what pieces ReduceGradientsInRankOrder
// reduces it (the whole entry in RAM, or its NVMe chunks): ranks whose fingerprints differ would
// call the collectives with different counts, so it belongs to what CheckSameJob compares.
std::string GradientLayoutFingerprint(const ParameterStore& store);

// OK on every rank when `mine` is OK on every rank (an all-gather of one flag per rank), else an
// error on every rank: this rank's own, or ABORTED naming the first rank that failed. For steps
// every rank must pass together (a sharded checkpoint), so no rank is left waiting in a collective.
absl::Status AllRanksOk(dist::Communicator& comm, const absl::Status& mine);

// ZeRO-1 (docs/scale_out.md): each rank owns a contiguous range of whole chunks of every entry
// (Zero1Shards; maybe none), so a rank's part of each gradient norm partial is the one one
// process computes. Every collective below is made by every rank with the same table.

// Each entry's gradient slab becomes, in each owner's range and on that owner only, the
// rank-ordered sum of the ranks' slabs (ReduceFloatsInRankOrderTo per owned range; pairs for a
// rows' gradient kept apart, as in ReduceGradientsInRankOrder); the rest of every rank's slabs
// keep their own contributions. A gradient on NVMe goes chunk by chunk, each to its owner, who
// writes it back with its norm partials; the other ranks drop theirs unwritten.
absl::Status ReduceGradientsToOwners(dist::Communicator& comm, ParameterStore& store,
                                     const Zero1Shards& shards);

// Every entry's gradient sum of squares, the bits one process computes from the full reduced
// gradient (grad_norm.h): each rank computes the norm's chunk partials of its ranges (one run of
// the model's partials, its ranges being consecutive), the runs are all-gathered (each padded to
// the longest), and each entry's partials are added in chunk order. `pool` as for
// GradSumOfSquares.
absl::StatusOr<std::vector<double>> OwnedGradSumsOfSquares(dist::Communicator& comm,
                                                           const ParameterStore& store,
                                                           const Zero1Shards& shards,
                                                           ThreadPool* pool);

// After the owners' optimizer pass: every owned range of every entry's master (the CPU device's
// compute copy) is broadcast from its owner, in entry order, so every rank streams the same
// weights; compute copies, where the store has them, are rewritten from the masters. With the
// masters on NVMe (each rank's state file holds its ranges only) the fp32 compute copy's ranges
// are broadcast instead (the owners' updates wrote them).
absl::Status BroadcastUpdatedMasters(dist::Communicator& comm, ParameterStore& store,
                                     const Zero1Shards& shards);

}  // namespace megatrain::engine
