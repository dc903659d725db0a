// Combining the ranks' counts, loss sums and gradients (see data_parallel_step.h).
#include "engine/train/data_parallel_step.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/exec/nvme_gradients.h"
#include "engine/optimizer/grad_norm.h"

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

absl::StatusOr<int> RankFirstDevice(const RankDevicesInputs& in) {
  if (in.local_size < 1 || in.local_rank < 0 || in.local_rank >= in.local_size ||
      in.devices_per_rank < 1 || in.visible < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "local rank ", in.local_rank, " of ", in.local_size, " with devices=", in.devices_per_rank,
        " and ", in.visible, " visible devices"));
  }
  if (in.visible >= in.local_size * in.devices_per_rank) {
    return in.local_rank * in.devices_per_rank;
  }
  // Fewer than the machine's ranks need: only a launcher that gave each rank a set of its own can
  // make that work (CheckDistinctGpus then verifies that the sets are disjoint).
  if (in.launcher_restricted && in.visible >= in.devices_per_rank) return 0;
  return absl::InvalidArgumentError(absl::StrCat(
      "devices=", in.devices_per_rank, " per rank with ", in.local_size,
      " ranks on this machine needs ", in.local_size * in.devices_per_rank,
      " GPUs, but local rank ", in.local_rank, " sees ", in.visible,
      in.launcher_restricted ? " (CUDA_VISIBLE_DEVICES is set)" : "",
      ": start fewer ranks per machine, ask for fewer devices, give each rank exactly its own "
      "GPUs (CUDA_VISIBLE_DEVICES per rank, srun --gpus-per-task), or name the first one "
      "(cuda_device)"));
}

namespace {

uint64_t Fingerprint(const std::string& text) {
  uint64_t hash = 14695981039346656037ull;  // FNV-1a: a fingerprint, not a defence
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

}  // namespace

absl::Status CheckDistinctGpus(dist::Communicator& comm, const std::vector<std::string>& gpu_ids) {
  // The counts first, so ranks with different numbers of GPUs are told so rather than
  // mismatching the gather.
  const double count[1] = {static_cast<double>(gpu_ids.size())};
  absl::StatusOr<std::vector<double>> counts = comm.AllGatherDoubles(count);
  if (!counts.ok()) return counts.status();
  for (int r = 0; r < comm.size(); ++r) {
    if ((*counts)[r] != count[0]) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", r, " drives ", (*counts)[r], " GPUs but rank ", comm.rank(),
                       " drives ", gpu_ids.size(), "; every rank must get the same --devices"));
    }
  }
  std::vector<double> mine;
  for (const std::string& id : gpu_ids) {
    const uint64_t h = Fingerprint(id);
    // Two 32-bit halves: exact as doubles.
    mine.push_back(static_cast<double>(h >> 32));
    mine.push_back(static_cast<double>(h & 0xffffffffu));
  }
  absl::StatusOr<std::vector<double>> all = comm.AllGatherDoubles(mine);
  if (!all.ok()) return all.status();
  const size_t per_rank = gpu_ids.size();
  for (size_t a = 0; a < all->size() / 2; ++a) {
    for (size_t b = a + 1; b < all->size() / 2; ++b) {
      if ((*all)[2 * a] != (*all)[2 * b] || (*all)[2 * a + 1] != (*all)[2 * b + 1]) continue;
      const size_t rank_a = a / per_rank;
      const size_t rank_b = b / per_rank;
      const size_t me = static_cast<size_t>(comm.rank());
      // This rank can name the GPU when it is one of the two.
      const std::string which = rank_a == me   ? absl::StrCat(" (", gpu_ids[a % per_rank], ")")
                                : rank_b == me ? absl::StrCat(" (", gpu_ids[b % per_rank], ")")
                                               : std::string();
      return absl::FailedPreconditionError(absl::StrCat(
          rank_a == rank_b ? absl::StrCat("rank ", rank_a, " drives one GPU twice")
                           : absl::StrCat("ranks ", rank_a, " and ", rank_b, " drive the same GPU"),
          which,
          ": give each rank GPUs of its own (CUDA_VISIBLE_DEVICES per rank, or fewer ranks or "
          "--devices per machine)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSameJob(dist::Communicator& comm, const std::string& identity) {
  const uint64_t hash = Fingerprint(identity);
  // Two 32-bit halves: exact as doubles.
  const double mine[2] = {static_cast<double>(hash >> 32), static_cast<double>(hash & 0xffffffffu)};
  absl::StatusOr<std::vector<double>> all = comm.AllGatherDoubles(mine);
  if (!all.ok()) return all.status();
  for (int r = 1; r < comm.size(); ++r) {
    if ((*all)[2 * r] != (*all)[0] || (*all)[2 * r + 1] != (*all)[1]) {
      return absl::FailedPreconditionError(
          absl::StrCat("data parallelism: rank ", r,
                       " runs a different job from rank 0 (its options, data or "
                       "resume step differ); every rank must be started with the same flags"));
    }
  }
  return absl::OkStatus();
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

namespace {

// Entry e's gradient on NVMe, chunk by chunk: each chunk is staged (read back), reduced in place,
// and ended, which records the reduced chunk's norm partials and writes it back. Every chunk is
// ended even when the reduction fails, so no staging slot stays taken.
absl::Status ReduceNvmeGradientInRankOrder(dist::Communicator& comm, NvmeGradients& grads, int e) {
  for (int c = 0; c < grads.num_chunks(e); ++c) {
    absl::StatusOr<float*> staged = grads.BeginChunk(e, c, /*overwrite=*/false);
    if (!staged.ok()) return staged.status();
    absl::Status reduced = comm.ReduceFloatsInRankOrder(*staged, grads.chunk(e, c).count);
    absl::Status ended = grads.EndChunk(e, c);
    if (!reduced.ok()) return reduced;
    if (!ended.ok()) return ended;
  }
  return absl::OkStatus();
}

}  // namespace

std::string GradientLayoutFingerprint(const ParameterStore& store) {
  std::string layout;
  for (int e = 0; e < store.num_entries(); ++e) {
    if (!store.grad_on_nvme(e)) {
      // "+rows": reduced as pairs with the rows' gradient kept apart (one more array sent).
      absl::StrAppend(&layout, store.entry(e).elements,
                      store.rows_gradient(e) != nullptr ? "+rows " : " ");
      continue;
    }
    const NvmeGradients& grads = *store.nvme_gradients();
    absl::StrAppend(&layout, "nvme");
    for (int c = 0; c < grads.num_chunks(e); ++c) {
      absl::StrAppend(&layout, ":", grads.chunk(e, c).count);
    }
    absl::StrAppend(&layout, " ");
  }
  return layout;
}

absl::Status ReduceGradientsInRankOrder(dist::Communicator& comm, ParameterStore& store) {
  for (int e = 0; e < store.num_entries(); ++e) {
    const EntryBuffers b = store.entry(e);
    if (b.grad == nullptr) {
      if (absl::Status s = ReduceNvmeGradientInRankOrder(comm, *store.nvme_gradients(), e);
          !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("reducing entry ", e,
                                                   "'s gradient on NVMe: ", s.message()));
      }
      continue;
    }
    // A tied embedding: the LM head's gradient in the slab, the rows' scatter apart, added in
    // one process's order h_0, E_0, h_1, E_1, ...
    const float* apart = store.rows_gradient(e);
    if (absl::Status s = apart != nullptr
                             ? comm.ReduceFloatPairsInRankOrder(b.grad, apart, b.elements)
                             : comm.ReduceFloatsInRankOrder(b.grad, b.elements);
        !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("reducing entry ", e, "'s gradient: ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status GatherReducedGradients(dist::Communicator& comm, ParameterStore& store,
                                    const std::vector<bool>& shards) {
  for (int e = 0; e < store.num_entries(); ++e) {
    const EntryBuffers b = store.entry(e);
    if (b.grad == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "entry ", e, "'s gradient is on NVMe; a reduce-scatter among the ranks needs it in RAM"));
    }
    if (store.rows_gradient(e) != nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "entry ", e, " keeps a tied embedding's rows' gradient apart, which a reduce-scatter "
                       "among the ranks does not reduce (tied embeddings are refused)"));
    }
    const bool shard = shards[static_cast<size_t>(e)];
    if (absl::Status s = shard ? comm.AllGatherFloatShards(b.grad, b.elements)
                               : comm.ReduceFloatsInRankOrder(b.grad, b.elements);
        !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(shard ? "gathering entry " : "reducing entry ", e,
                                                 "'s gradient: ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status AllRanksOk(dist::Communicator& comm, const absl::Status& mine) {
  const double failed[1] = {mine.ok() ? 0.0 : 1.0};
  absl::StatusOr<std::vector<double>> all = comm.AllGatherDoubles(failed);
  if (!all.ok()) return all.status();
  if (!mine.ok()) {
    return absl::Status(mine.code(), absl::StrCat("rank ", comm.rank(), ": ", mine.message()));
  }
  for (int r = 0; r < comm.size(); ++r) {
    if ((*all)[r] != 0) {
      return absl::AbortedError(absl::StrCat("rank ", r, " failed (its own error says why)"));
    }
  }
  return absl::OkStatus();
}

namespace {

// Entry e's gradient on NVMe, chunk by chunk, each to its owner (ranges are whole chunks): the
// owner's staged chunk becomes the rank-ordered sum and is ended (its norm partials recorded,
// written back); the others' are dropped unwritten. Every chunk is ended or dropped even when
// the reduction fails, so no staging slot stays taken.
absl::Status ReduceNvmeGradientToOwners(dist::Communicator& comm, NvmeGradients& grads, int e,
                                        const Zero1Shards& shards) {
  for (int c = 0; c < grads.num_chunks(e); ++c) {
    const EntryChunk chunk = grads.chunk(e, c);
    const int owner = shards.owner_of(e, chunk.first);
    absl::StatusOr<float*> staged = grads.BeginChunk(e, c, /*overwrite=*/false);
    if (!staged.ok()) return staged.status();
    absl::Status reduced = comm.ReduceFloatsInRankOrderTo(*staged, chunk.count, owner);
    absl::Status ended = owner == comm.rank() ? grads.EndChunk(e, c) : grads.DropChunk(e, c);
    if (!reduced.ok()) {
      return absl::Status(reduced.code(),
                          absl::StrCat("chunk ", c, " to rank ", owner, ": ", reduced.message()));
    }
    if (!ended.ok()) return ended;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReduceGradientsToOwners(dist::Communicator& comm, ParameterStore& store,
                                     const Zero1Shards& shards) {
  for (int e = 0; e < store.num_entries(); ++e) {
    const EntryBuffers b = store.entry(e);
    if (b.grad == nullptr) {
      if (absl::Status s = ReduceNvmeGradientToOwners(comm, *store.nvme_gradients(), e, shards);
          !s.ok()) {
        return absl::Status(
            s.code(), absl::StrCat("reducing entry ", e, "'s gradient on NVMe: ", s.message()));
      }
      continue;
    }
    const float* apart = store.rows_gradient(e);  // as in ReduceGradientsInRankOrder
    for (int owner = 0; owner < shards.world(); ++owner) {
      const ElementRange r = shards.range(e, owner);
      if (r.count == 0) continue;
      if (absl::Status s = apart != nullptr
                               ? comm.ReduceFloatPairsInRankOrderTo(b.grad + r.first,
                                                                    apart + r.first, r.count, owner)
                               : comm.ReduceFloatsInRankOrderTo(b.grad + r.first, r.count, owner);
          !s.ok()) {
        return absl::Status(
            s.code(), absl::StrCat("reducing entry ", e, "'s gradient [", r.first, ", ", r.end(),
                                   ") to rank ", owner, ": ", s.message()));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<double>> OwnedGradSumsOfSquares(dist::Communicator& comm,
                                                           const ParameterStore& store,
                                                           const Zero1Shards& shards,
                                                           ThreadPool* pool) {
  // Every entry's norm chunks, laid end to end: entry e's partial k at base[e] + k.
  const auto norm_chunks = [](size_t elements) {
    return (elements + kGradNormChunkElements - 1) / kGradNormChunkElements;
  };
  std::vector<size_t> base(store.num_entries() + 1, 0);
  for (int e = 0; e < store.num_entries(); ++e) {
    base[e + 1] = base[e] + norm_chunks(store.spec(e).elements);
  }
  // A rank's ranges are consecutive runs of whole chunks in unit order, so its partials are one
  // run [first[r], end[r]) of that line: each rank sends only its run, padded to the longest.
  const int world = shards.world();
  std::vector<size_t> first(world, 0), end(world, 0);
  size_t longest = 0;
  for (int r = 0; r < world; ++r) {
    bool any = false;
    for (int e = 0; e < store.num_entries(); ++e) {
      const ElementRange range = shards.range(e, r);
      if (range.count == 0) continue;
      const size_t k0 = base[e] + range.first / kGradNormChunkElements;
      const size_t k1 = base[e] + (range.end() + kGradNormChunkElements - 1) / kGradNormChunkElements;
      if (!any) first[r] = k0;
      if (any && k0 != end[r]) {
        return absl::InternalError(absl::StrCat("rank ", r, "'s ZeRO-1 ranges are not one run"));
      }
      end[r] = k1;
      any = true;
    }
    longest = std::max(longest, end[r] - first[r]);
  }
  std::vector<double> mine(std::max<size_t>(1, longest), 0.0);
  for (int e = 0; e < store.num_entries(); ++e) {
    const ElementRange r = shards.range(e, comm.rank());
    if (r.count == 0) continue;
    // Ranges start at whole store chunks, multiples of the norm's chunk (ParameterStore::Create
    // checks nvme_chunk_bytes), so these are the partials of the whole gradient.
    double* out =
        mine.data() + (base[e] + r.first / kGradNormChunkElements - first[comm.rank()]);
    const float* grad = store.entry(e).grad;
    if (grad == nullptr) {
      // On NVMe: the owner's chunks recorded them when their reduction ended.
      store.nvme_gradients()->CopyPartials(e, r.first, r.count, out);
    } else {
      GradChunkSumsOfSquares(absl::MakeConstSpan(grad + r.first, r.count), pool, out);
    }
  }
  absl::StatusOr<std::vector<double>> all = comm.AllGatherDoubles(mine);
  if (!all.ok()) return all.status();
  // Every rank's run back in its place on the line, then each entry's added in chunk order.
  std::vector<double> line(base.back(), 0.0);
  for (int r = 0; r < world; ++r) {
    const double* from = all->data() + static_cast<size_t>(r) * mine.size();
    std::copy(from, from + (end[r] - first[r]), line.begin() + first[r]);
  }
  std::vector<double> sums(store.num_entries());
  for (int e = 0; e < store.num_entries(); ++e) {
    sums[e] = SumPartials(absl::MakeConstSpan(line.data() + base[e], base[e + 1] - base[e]));
  }
  return sums;
}

absl::Status BroadcastUpdatedMasters(dist::Communicator& comm, ParameterStore& store,
                                     const Zero1Shards& shards) {
  for (int e = 0; e < store.num_entries(); ++e) {
    const EntryBuffers b = store.entry(e);
    // With the master on NVMe (each rank's file holds its ranges only) the fp32 compute copy is
    // what every rank needs whole, and the owner's update wrote its range of it.
    float* const weights = b.master != nullptr ? b.master : b.compute_fp32;
    if (weights == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ZeRO-1 needs the masters, or an fp32 compute copy, in RAM; entry ", e, " has neither"));
    }
    for (int owner = 0; owner < shards.world(); ++owner) {
      const ElementRange r = shards.range(e, owner);
      if (r.count == 0) continue;
      if (absl::Status s = comm.Broadcast(weights + r.first, r.count * sizeof(float), owner);
          !s.ok()) {
        return absl::Status(
            s.code(), absl::StrCat("broadcasting entry ", e, "'s master [", r.first, ", ", r.end(),
                                   ") from rank ", owner, ": ", s.message()));
      }
    }
  }
  return store.RefreshComputeCopy();
}

}  // namespace megatrain::engine
