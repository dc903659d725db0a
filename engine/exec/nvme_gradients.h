// NvmeGradients: the fp32 gradients of the parameter store's entries kept in an
// O_DIRECT file on the NVMe tier instead of RAM, in the store's chunks.
//
// Protocol (DESIGN.md "one training step"):
//  1. Backward's copy-out brings a chunk of an entry's gradient into pinned
//     staging, then BeginChunk(overwrite = first contribution of the step)
//     stages the chunk (the previous micro-batches' sum is read back unless it
//     is overwritten), the caller writes or adds the new values in place, and
//     EndChunk records the chunk's gradient-norm partials (grad_norm.h) and
//     writes it back asynchronously. The last micro-batch's partials are the
//     accumulated gradient's, so the global norm never re-reads the file.
//  2. The optimizer pass, after the norm is known, reads chunks back in unit
//     order with read-ahead (AcquireForUpdate / ReleaseAfterUpdate).
//  3. The normal pass never overlaps the copy-out (every update of a step is
//     published before the next backward); the trainer's speculative update
//     does, reading each entry once its gradient is final while the copy-out
//     writes the entries below (the one store keeps a read behind a pending
//     write of the same chunk). They run on different threads, so every call
//     takes the mutex. The first I/O error is sticky and names the file and
//     offset.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/exec/entry_chunks.h"
#include "engine/tiers/nvme_state_store.h"

namespace megatrain::engine {

class NvmeGradients {
 public:
  // `on_nvme[e]` says which entries' gradients live here (the others stay in
  // RAM). `io` must outlive this.
  static absl::StatusOr<std::unique_ptr<NvmeGradients>> Create(
      tiers::BlockIo& io, const tiers::NvmeStateStoreOptions& options, const EntryChunks& chunks,
      std::vector<bool> on_nvme);

  bool on_nvme(int entry) const { return on_nvme_[entry]; }
  int num_chunks(int entry) const { return chunks_.num_chunks(entry); }
  EntryChunk chunk(int entry, int c) const { return chunks_.chunk(entry, c); }

  // 1. The staged chunk, to be written whole (overwrite) or added to.
  absl::StatusOr<float*> BeginChunk(int entry, int c, bool overwrite);
  // The staging of a chunk begun and not yet ended (a copy-out that fills a
  // chunk in several pieces, such as the head's vocabulary blocks).
  absl::StatusOr<float*> Staged(int entry, int c) const;
  absl::Status EndChunk(int entry, int c);
  // Ends a begun chunk without writing it back or recording its partials: a ZeRO-1 rank's chunk
  // after its reduction to another rank, the owner (what this rank's file keeps is its own
  // contribution, which the next step's first micro-batch overwrites).
  absl::Status DropChunk(int entry, int c);
  // The sum of squares of the entry's gradient as of the last EndChunk of
  // each chunk: GradSumOfSquares' bits for the same values.
  double SumOfSquares(int entry) const;
  // The norm partials (one per 64 Ki elements, grad_norm.h) of elements [first, first + count)
  // of the entry, as of each chunk's last EndChunk, into out; first must be a multiple of
  // kGradNormChunkElements (a chunk's start).
  void CopyPartials(int entry, size_t first, size_t count, double* out) const;

  // 2. Read back for the optimizer, with read-ahead in unit order.
  // `within_entry`: read ahead only the entry's next chunk (an update in another order than
  // the units', such as the speculative update's, which follows the backward).
  absl::StatusOr<const float*> AcquireForUpdate(int entry, int c, bool within_entry = false);
  absl::Status ReleaseAfterUpdate(int entry, int c);

  // The whole entry's gradient into out (entry elements floats); not during a step.
  absl::Status Read(int entry, float* out);

  uint64_t staging_bytes() const { return store_->staging_bytes(); }
  const std::string& path() const { return store_->path(); }
  tiers::NvmeStateStoreStats stats() const;

 private:
  NvmeGradients(std::unique_ptr<tiers::NvmeStateStore> store, const EntryChunks& chunks,
                std::vector<bool> on_nvme);

  mutable absl::Mutex mu_;
  std::unique_ptr<tiers::NvmeStateStore> store_ ABSL_GUARDED_BY(mu_);
  EntryChunks chunks_;
  std::vector<bool> on_nvme_;
  std::vector<std::vector<double>> partials_ ABSL_GUARDED_BY(mu_);  // per entry
  std::vector<float*> staged_ ABSL_GUARDED_BY(mu_);  // per unit, while begun
};

}  // namespace megatrain::engine
