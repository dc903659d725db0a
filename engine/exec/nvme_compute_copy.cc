// NvmeComputeCopy: chunked compute-copy staging over an NvmeStateStore of one array per unit.
#include "engine/exec/nvme_compute_copy.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace megatrain::engine {
namespace {

// The store counts floats; a unit of `count` elements of `element_bytes` takes this many.
size_t UnitFloats(size_t count, size_t element_bytes) {
  return (count * element_bytes + sizeof(float) - 1) / sizeof(float);
}

}  // namespace

absl::StatusOr<std::unique_ptr<NvmeComputeCopy>> NvmeComputeCopy::Create(
    tiers::BlockIo& io, const tiers::NvmeStateStoreOptions& options, const EntryChunks& chunks,
    size_t element_bytes, std::vector<bool> on_nvme) {
  if (element_bytes != 2 && element_bytes != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("compute copy element_bytes=", element_bytes, " must be 2 or 4"));
  }
  tiers::NvmeStateStoreOptions o = options;
  o.arrays_per_entry = 1;
  o.file_name = tiers::kComputeCopyFileName;
  // Copies and the next writes do not follow unit order across a step: no wrap.
  o.read_ahead_wraps = false;
  std::vector<size_t> units;
  for (size_t n : chunks.unit_elements()) units.push_back(UnitFloats(n, element_bytes));
  absl::StatusOr<std::unique_ptr<tiers::NvmeStateStore>> store =
      tiers::NvmeStateStore::Create(io, o, units);
  if (!store.ok()) return store.status();
  return std::unique_ptr<NvmeComputeCopy>(
      new NvmeComputeCopy(*std::move(store), chunks, element_bytes, std::move(on_nvme)));
}

NvmeComputeCopy::NvmeComputeCopy(std::unique_ptr<tiers::NvmeStateStore> store,
                                 const EntryChunks& chunks, size_t element_bytes,
                                 std::vector<bool> on_nvme)
    : chunks_(chunks), element_bytes_(element_bytes), on_nvme_(std::move(on_nvme)) {
  // Copies may hold all slots but two: one for the optimizer's write, one for read-ahead.
  max_held_ = std::max(1, store->staging_slots() - 2);
  copy_refs_.assign(static_cast<size_t>(chunks_.num_units()), 0);
  staged_.assign(static_cast<size_t>(chunks_.num_units()), nullptr);
  store_ = std::move(store);
}

absl::StatusOr<char*> NvmeComputeCopy::BeginWrite(int entry, int c) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<tiers::StagedEntry> staged =
      store_->AcquireForOverwrite(chunks_.chunk(entry, c).unit);
  if (!staged.ok()) return staged.status();
  return reinterpret_cast<char*>(staged->array(0));
}

absl::Status NvmeComputeCopy::EndWrite(int entry, int c) {
  absl::MutexLock lock(&mu_);
  return store_->Release(chunks_.chunk(entry, c).unit, /*dirty=*/true);
}

absl::StatusOr<const char*> NvmeComputeCopy::AcquireForCopy(
    int entry, int c, const std::function<absl::Status()>& copies_failed) {
  const int unit = chunks_.chunk(entry, c).unit;
  absl::MutexLock lock(&mu_);
  if (!release_status_.ok()) return release_status_;
  if (copy_refs_[unit] > 0) {
    ++copy_refs_[unit];
    return staged_[unit];
  }
  auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return held_ < max_held_; };
  // The stream's failure does not signal this mutex: looked at between bounded waits, with the
  // mutex released (the stream takes its own lock).
  while (!mu_.AwaitWithTimeout(absl::Condition(&room), absl::Milliseconds(20))) {
    if (copies_failed == nullptr) continue;
    mu_.Unlock();
    const absl::Status failed = copies_failed();
    mu_.Lock();
    if (!failed.ok() && !room()) {
      return absl::Status(failed.code(),
                          absl::StrCat("waiting for a staged chunk of ", store_->path(),
                                       ": the copies that release them failed: ", failed.message()));
    }
  }
  absl::StatusOr<tiers::StagedEntry> staged = store_->Acquire(unit);
  if (!staged.ok()) return staged.status();
  ++held_;
  copy_refs_[unit] = 1;
  staged_[unit] = reinterpret_cast<char*>(staged->array(0));
  return staged_[unit];
}

void NvmeComputeCopy::ReleaseAfterCopy(int entry, int c) {
  const int unit = chunks_.chunk(entry, c).unit;
  absl::MutexLock lock(&mu_);
  if (--copy_refs_[unit] > 0) return;
  staged_[unit] = nullptr;
  --held_;
  absl::Status s = store_->Release(unit, /*dirty=*/false);
  if (!s.ok() && release_status_.ok()) release_status_ = s;
}

absl::Status NvmeComputeCopy::Read(int entry, char* out) {
  absl::MutexLock lock(&mu_);
  for (int c = 0; c < chunks_.num_chunks(entry); ++c) {
    const EntryChunk chunk = chunks_.chunk(entry, c);
    absl::StatusOr<tiers::StagedEntry> staged = store_->Acquire(chunk.unit, /*read_ahead=*/0);
    if (!staged.ok()) return staged.status();
    std::memcpy(out + chunk.first * element_bytes_, staged->array(0), chunk.count * element_bytes_);
    if (absl::Status s = store_->Release(chunk.unit, /*dirty=*/false); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status NvmeComputeCopy::Flush() {
  absl::MutexLock lock(&mu_);
  return store_->Flush();
}

uint64_t NvmeComputeCopy::staging_bytes() const {
  absl::MutexLock lock(&mu_);
  return store_->staging_bytes();
}

const std::string& NvmeComputeCopy::path() const {
  absl::MutexLock lock(&mu_);
  return store_->path();
}

tiers::NvmeStateStoreStats NvmeComputeCopy::stats() const {
  absl::MutexLock lock(&mu_);
  return store_->stats();
}

}  // namespace megatrain::engine
