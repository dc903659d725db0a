// NvmeGradients: chunked gradient staging over an NvmeStateStore of one array per unit.
#include "engine/exec/nvme_gradients.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/optimizer/grad_norm.h"

namespace megatrain::engine {

absl::StatusOr<std::unique_ptr<NvmeGradients>> NvmeGradients::Create(
    tiers::BlockIo& io, const tiers::NvmeStateStoreOptions& options, const EntryChunks& chunks,
    std::vector<bool> on_nvme) {
  if (chunks.chunk_elements() % kGradNormChunkElements != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NVMe chunk of ", chunks.chunk_elements(), " elements must be a multiple of ",
        kGradNormChunkElements, " (the gradient norm's chunk)"));
  }
  tiers::NvmeStateStoreOptions o = options;
  o.arrays_per_entry = 1;
  o.read_ahead_wraps = false;  // the copy-out writes next, in its own order
  absl::StatusOr<std::unique_ptr<tiers::NvmeStateStore>> store =
      tiers::NvmeStateStore::Create(io, o, chunks.unit_elements());
  if (!store.ok()) return store.status();
  return std::unique_ptr<NvmeGradients>(
      new NvmeGradients(*std::move(store), chunks, std::move(on_nvme)));
}

NvmeGradients::NvmeGradients(std::unique_ptr<tiers::NvmeStateStore> store,
                             const EntryChunks& chunks, std::vector<bool> on_nvme)
    : store_(std::move(store)), chunks_(chunks), on_nvme_(std::move(on_nvme)) {
  const std::vector<size_t> units = chunks_.unit_elements();
  staged_.assign(units.size(), nullptr);
  for (size_t e = 0; e < on_nvme_.size(); ++e) {
    size_t elements = 0;
    for (int c = 0; c < chunks_.num_chunks(static_cast<int>(e)); ++c) {
      elements += chunks_.chunk(static_cast<int>(e), c).count;
    }
    partials_.emplace_back((elements + kGradNormChunkElements - 1) / kGradNormChunkElements, 0.0);
  }
}

absl::StatusOr<float*> NvmeGradients::BeginChunk(int entry, int c, bool overwrite) {
  absl::MutexLock lock(&mu_);
  const EntryChunk chunk = chunks_.chunk(entry, c);
  absl::StatusOr<tiers::StagedEntry> staged =
      overwrite ? store_->AcquireForOverwrite(chunk.unit)
                : store_->Acquire(chunk.unit, /*read_ahead=*/0);
  if (!staged.ok()) return staged.status();
  if (!overwrite && c + 1 < chunks_.num_chunks(entry)) {
    // The next chunk of this entry is what the copy-out adds to next.
    if (absl::Status s = store_->Prefetch(chunk.unit + 1); !s.ok()) return s;
  }
  staged_[chunk.unit] = staged->array(0);
  return staged->array(0);
}

absl::StatusOr<float*> NvmeGradients::Staged(int entry, int c) const {
  absl::MutexLock lock(&mu_);
  float* values = staged_[chunks_.chunk(entry, c).unit];
  if (values == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("gradient chunk ", c, " of entry ", entry,
                                                      " was not begun"));
  }
  return values;
}

absl::Status NvmeGradients::EndChunk(int entry, int c) {
  absl::MutexLock lock(&mu_);
  const EntryChunk chunk = chunks_.chunk(entry, c);
  const float* values = staged_[chunk.unit];
  if (values == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("gradient chunk ", c, " of entry ", entry,
                                                      " was not begun"));
  }
  GradChunkSumsOfSquares(absl::MakeConstSpan(values, chunk.count), /*pool=*/nullptr,
                         partials_[entry].data() + chunk.first / kGradNormChunkElements);
  staged_[chunk.unit] = nullptr;
  return store_->Release(chunk.unit, /*dirty=*/true);
}

absl::Status NvmeGradients::DropChunk(int entry, int c) {
  absl::MutexLock lock(&mu_);
  const EntryChunk chunk = chunks_.chunk(entry, c);
  if (staged_[chunk.unit] == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("gradient chunk ", c, " of entry ", entry, " was not begun"));
  }
  staged_[chunk.unit] = nullptr;
  return store_->Release(chunk.unit, /*dirty=*/false);
}

void NvmeGradients::CopyPartials(int entry, size_t first, size_t count, double* out) const {
  absl::MutexLock lock(&mu_);
  const size_t begin = first / kGradNormChunkElements;
  const size_t end = (first + count + kGradNormChunkElements - 1) / kGradNormChunkElements;
  std::copy(partials_[entry].begin() + begin, partials_[entry].begin() + end, out);
}

double NvmeGradients::SumOfSquares(int entry) const {
  absl::MutexLock lock(&mu_);
  return SumPartials(partials_[entry]);
}

absl::StatusOr<const float*> NvmeGradients::AcquireForUpdate(int entry, int c, bool within_entry) {
  absl::MutexLock lock(&mu_);
  const int unit = chunks_.chunk(entry, c).unit;
  absl::StatusOr<tiers::StagedEntry> staged =
      within_entry ? store_->Acquire(unit, /*read_ahead=*/0) : store_->Acquire(unit);
  if (!staged.ok()) return staged.status();
  if (within_entry && c + 1 < chunks_.num_chunks(entry)) {
    if (absl::Status s = store_->Prefetch(unit + 1); !s.ok()) return s;
  }
  return static_cast<const float*>(staged->array(0));
}

absl::Status NvmeGradients::ReleaseAfterUpdate(int entry, int c) {
  absl::MutexLock lock(&mu_);
  return store_->Release(chunks_.chunk(entry, c).unit, /*dirty=*/false);
}

absl::Status NvmeGradients::Read(int entry, float* out) {
  absl::MutexLock lock(&mu_);
  for (int c = 0; c < chunks_.num_chunks(entry); ++c) {
    const EntryChunk chunk = chunks_.chunk(entry, c);
    absl::StatusOr<tiers::StagedEntry> staged = store_->Acquire(chunk.unit, /*read_ahead=*/0);
    if (!staged.ok()) return staged.status();
    std::memcpy(out + chunk.first, staged->array(0), chunk.count * sizeof(float));
    if (absl::Status s = store_->Release(chunk.unit, /*dirty=*/false); !s.ok()) return s;
  }
  return absl::OkStatus();
}

tiers::NvmeStateStoreStats NvmeGradients::stats() const {
  absl::MutexLock lock(&mu_);
  return store_->stats();
}

}  // namespace megatrain::engine
