// NvmeComputeCopy: the compute copy (bf16 on a GPU, fp32 on the CPU device) of
// the parameter store's entries kept in an O_DIRECT file on the NVMe tier, in
// the store's chunks, so RAM holds no per-parameter array at all.
//
// Protocol:
//  1. The optimizer pass (and loads) rewrite a chunk whole: BeginWrite stages
//     it without a read, the caller writes every element, EndWrite writes it
//     back asynchronously.
//  2. The executor's enqueuing thread, after the entry's update is published,
//     calls AcquireForCopy for each chunk a weight copy covers: it blocks until
//     the chunk is in RAM (read ahead in unit order) and returns an address
//     that stays valid until the matching ReleaseAfterCopy, which a copy-in
//     stream task runs once the copy has landed. Acquires are counted per
//     chunk (two fragments of one chunk share it). At most max_held chunks are
//     held; beyond that AcquireForCopy waits for a release, which the copy-in
//     stream makes by running work enqueued earlier (never later), so it
//     cannot deadlock while the stream runs. A failed stream skips the
//     releases behind its failure: the wait then ends with the stream's
//     failure (`copies_failed`, asked while it waits) instead of forever.
//  3. Every call takes the mutex (the update thread and the enqueuing thread
//     run at once). The first I/O error is sticky and names file and offset.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/exec/entry_chunks.h"
#include "engine/tiers/nvme_state_store.h"
#include "engine/tiers/nvme_tier_files.h"

namespace megatrain::engine {

class NvmeComputeCopy {
 public:
  // `chunks` counts elements (0 for entries kept in RAM); element_bytes is 2
  // (bf16) or 4 (fp32). `io` must outlive this.
  static absl::StatusOr<std::unique_ptr<NvmeComputeCopy>> Create(
      tiers::BlockIo& io, const tiers::NvmeStateStoreOptions& options, const EntryChunks& chunks,
      size_t element_bytes, std::vector<bool> on_nvme);

  bool on_nvme(int entry) const { return on_nvme_[entry]; }
  int num_chunks(int entry) const { return chunks_.num_chunks(entry); }
  EntryChunk chunk(int entry, int c) const { return chunks_.chunk(entry, c); }
  size_t element_bytes() const { return element_bytes_; }

  // 1. The chunk's bytes (count x element_bytes), to be written whole.
  absl::StatusOr<char*> BeginWrite(int entry, int c);
  absl::Status EndWrite(int entry, int c);

  // 2. The chunk's bytes in RAM for a host-to-device copy. `copies_failed` (if set) says whether
  // the stream that runs the releases has failed (Stream::Failure): a wait for room gives up
  // with that failure.
  absl::StatusOr<const char*> AcquireForCopy(
      int entry, int c, const std::function<absl::Status()>& copies_failed = nullptr);
  void ReleaseAfterCopy(int entry, int c);

  // The whole entry's copy into out (entry elements x element_bytes); not during a step.
  absl::Status Read(int entry, char* out);

  absl::Status Flush();
  uint64_t staging_bytes() const;
  const std::string& path() const;
  tiers::NvmeStateStoreStats stats() const;

 private:
  NvmeComputeCopy(std::unique_ptr<tiers::NvmeStateStore> store, const EntryChunks& chunks,
                  size_t element_bytes, std::vector<bool> on_nvme);

  mutable absl::Mutex mu_;
  std::unique_ptr<tiers::NvmeStateStore> store_ ABSL_GUARDED_BY(mu_);
  EntryChunks chunks_;
  size_t element_bytes_;
  std::vector<bool> on_nvme_;
  int max_held_;
  int held_ ABSL_GUARDED_BY(mu_) = 0;                  // chunks with copies pending
  std::vector<int> copy_refs_ ABSL_GUARDED_BY(mu_);    // per unit
  std::vector<char*> staged_ ABSL_GUARDED_BY(mu_);     // per unit, while acquired
  absl::Status release_status_ ABSL_GUARDED_BY(mu_);  // first failed release
};

}  // namespace megatrain::engine
