// NvmeStateStore: staging slots, read-ahead and bounded write-back over BlockIo.
#include "engine/tiers/nvme_state_store.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/tiers/direct_io_directory.h"

namespace megatrain::engine::tiers {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

absl::StatusOr<std::unique_ptr<NvmeStateStore>> NvmeStateStore::Create(
    BlockIo& io, const NvmeStateStoreOptions& options, std::vector<size_t> entry_elements,
    Init init) {
  if (options.arrays_per_entry < 1 || options.arrays_per_entry > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("arrays_per_entry=", options.arrays_per_entry, " must be 1, 2 or 3"));
  }
  if (options.read_ahead < 0 || options.max_writes_in_flight < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "read_ahead=", options.read_ahead,
        " must be >= 0 and max_writes_in_flight=", options.max_writes_in_flight, " >= 1"));
  }
  if (options.request_bytes == 0 || options.request_bytes % kDirectIoAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat("request_bytes=", options.request_bytes,
                                                   " must be a positive multiple of ",
                                                   kDirectIoAlignment));
  }
  if (absl::Status dir = CheckDirectIoDirectory(options.dir); !dir.ok()) return dir;

  std::vector<EntryLayout> entries;
  uint64_t offset = 0;
  uint64_t largest = 0;
  for (size_t elements : entry_elements) {
    EntryLayout e{elements, offset, RoundUpToBlock(uint64_t{elements} * sizeof(float))};
    offset += e.array_bytes * static_cast<uint64_t>(options.arrays_per_entry);
    largest = std::max(largest, e.array_bytes);
    entries.push_back(e);
  }
  // With alternate regions the second copy of every entry follows the first.
  const uint64_t file_bytes = options.alternate_regions ? 2 * offset : offset;
  const std::string path = absl::StrCat(options.dir, "/", options.file_name);
  absl::StatusOr<DirectFile> file =
      DirectFile::Open(path, init == Init::kZero ? DirectFile::Mode::kCreateTruncate
                                                 : DirectFile::Mode::kOpenExisting);
  if (!file.ok()) return file.status();
  if (init == Init::kZero) {
    if (absl::Status s = file->Reserve(file_bytes); !s.ok()) return s;
  } else {
    absl::StatusOr<uint64_t> size = file->Size();
    if (!size.ok()) return size.status();
    if (*size < file_bytes) {
      return absl::DataLossError(absl::StrCat("state file ", path, " is truncated: ", *size,
                                              " bytes, the layout needs ", file_bytes,
                                              " (first missing byte at offset ", *size, ")"));
    }
  }
  auto store = std::unique_ptr<NvmeStateStore>(
      new NvmeStateStore(io, options, *std::move(file), std::move(entries), file_bytes));
  if (options.alternate_regions) {
    store->region_bytes_ = offset;
    store->parity_.assign(store->entries_.size(), 0);
  }
  for (Slot& slot : store->slots_) {
    absl::StatusOr<AlignedBuffer> b =
        AlignedBuffer::Allocate(largest * static_cast<uint64_t>(options.arrays_per_entry));
    if (!b.ok()) return b.status();
    slot.buffer = *std::move(b);
  }
  return store;
}

NvmeStateStore::NvmeStateStore(BlockIo& io, NvmeStateStoreOptions options, DirectFile file,
                               std::vector<EntryLayout> entries, uint64_t file_bytes)
    : io_(io),
      options_(std::move(options)),
      file_(std::move(file)),
      entries_(std::move(entries)),
      file_bytes_(file_bytes),
      slots_(static_cast<size_t>(options_.staging_slots())) {}

NvmeStateStore::~NvmeStateStore() {
  for (Slot& slot : slots_) {
    for (const IoFuture& f : slot.pending) (void)f.Wait();
  }
}

uint64_t NvmeStateStore::staging_bytes() const {
  uint64_t total = 0;
  for (const Slot& s : slots_) total += s.buffer.size();
  return total;
}

absl::Status NvmeStateStore::CheckEntry(int entry) const {
  if (entry < 0 || entry >= num_entries()) {
    return absl::OutOfRangeError(
        absl::StrCat("entry=", entry, " is outside [0, ", num_entries(), ")"));
  }
  return absl::OkStatus();
}

NvmeStateStore::Slot* NvmeStateStore::FindSlot(int entry, int region) {
  if (region < 0) region = current_region(entry);
  for (Slot& s : slots_) {
    if (s.entry == entry && s.region == region) return &s;
  }
  return nullptr;
}

absl::Status NvmeStateStore::Await(Slot& slot) {
  for (const IoFuture& f : slot.pending) {
    absl::Status s = f.Wait();
    if (!s.ok() && status_.ok()) status_ = std::move(s);
  }
  slot.pending.clear();
  if (slot.state == SlotState::kWriting) {
    writes_.erase(std::find(writes_.begin(), writes_.end(), &slot));
  }
  if (slot.state != SlotState::kAcquired) slot.state = SlotState::kFree;
  if (!status_.ok()) slot.entry = -1;  // its contents are not known to match the file
  return status_;
}

absl::StatusOr<NvmeStateStore::Slot*> NvmeStateStore::TakeSlot(bool may_wait) {
  Slot* best = nullptr;
  for (Slot& s : slots_) {
    if (s.state == SlotState::kFree && (best == nullptr || s.last_use < best->last_use)) {
      best = &s;
    }
  }
  if (best == nullptr && may_wait) {
    if (!writes_.empty()) {
      best = writes_.front();
    } else {
      for (Slot& s : slots_) {
        if (s.state == SlotState::kReading && (best == nullptr || s.last_use < best->last_use)) {
          best = &s;
        }
      }
    }
    if (best == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("every one of the ", slots_.size(),
                       " NVMe staging slots is acquired; release an entry "
                       "before acquiring another"));
    }
    if (absl::Status s = Await(*best); !s.ok()) return s;
  }
  return best;
}

void NvmeStateStore::Transfer(Slot& slot, IoOp op) {
  const EntryLayout& e = entries_[slot.entry];
  const uint64_t bytes = e.array_bytes * static_cast<uint64_t>(options_.arrays_per_entry);
  const uint64_t base = e.offset + static_cast<uint64_t>(slot.region) * region_bytes_;
  for (uint64_t done = 0; done < bytes; done += options_.request_bytes) {
    const uint64_t chunk = std::min<uint64_t>(options_.request_bytes, bytes - done);
    slot.pending.push_back(
        io_.Submit({op, &file_, base + done, slot.buffer.data_as<char>() + done, chunk}));
  }
  (op == IoOp::kRead ? stats_.bytes_read : stats_.bytes_written) += bytes;
}

absl::Status NvmeStateStore::StartRead(int entry, bool may_wait) {
  if (FindSlot(entry) != nullptr) return absl::OkStatus();  // staged, being read or written
  absl::StatusOr<Slot*> slot = TakeSlot(may_wait);
  if (!slot.ok()) return slot.status();
  if (*slot == nullptr) return absl::OkStatus();  // no free slot: read-ahead waits for later
  (*slot)->entry = entry;
  (*slot)->region = current_region(entry);
  (*slot)->state = SlotState::kReading;
  (*slot)->last_use = ++clock_;
  Transfer(**slot, IoOp::kRead);
  return absl::OkStatus();
}

absl::Status NvmeStateStore::Prefetch(int entry) {
  if (!status_.ok()) return status_;
  if (absl::Status s = CheckHeld(entry); !s.ok()) return s;
  return StartRead(entry, /*may_wait=*/false);
}

absl::Status NvmeStateStore::CheckHeld(int entry) const {
  if (absl::Status s = CheckEntry(entry); !s.ok()) return s;
  if (entries_[entry].elements == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "entry ", entry, " of ", path(), " is empty: this store holds no bytes of it (another "
        "rank's, under ZeRO-1)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<StagedEntry> NvmeStateStore::Acquire(int entry, int read_ahead) {
  if (!status_.ok()) return status_;
  if (absl::Status s = CheckHeld(entry); !s.ok()) return s;
  Slot* slot = FindSlot(entry);
  if (slot != nullptr && slot->state == SlotState::kAcquired) {
    return absl::FailedPreconditionError(absl::StrCat("entry ", entry, " is already acquired"));
  }
  const bool hit = slot != nullptr && slot->state != SlotState::kReading;
  if (slot == nullptr) {
    if (absl::Status s = StartRead(entry, /*may_wait=*/true); !s.ok()) return s;
    slot = FindSlot(entry);
  }
  // A staged copy is claimed now so read-ahead below cannot take it; a slot still reading or
  // writing this entry is safe from read-ahead (which only takes free slots) until awaited.
  if (slot->state == SlotState::kFree) slot->state = SlotState::kAcquired;
  const int ahead = read_ahead < 0 ? options_.read_ahead : read_ahead;
  // Empty entries (another ZeRO-1 rank's, which hold no bytes here) are passed over, not
  // counted: the read-ahead reaches the next entries this store really holds.
  int started = 0;
  for (int k = 1; started < ahead && k < num_entries(); ++k) {
    int next = entry + k;
    if (next >= num_entries()) {
      if (!options_.read_ahead_wraps) break;
      next %= num_entries();
    }
    if (entries_[next].elements == 0) continue;
    if (absl::Status s = StartRead(next, /*may_wait=*/false); !s.ok()) return s;
    ++started;
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (slot->state != SlotState::kAcquired) {
    if (absl::Status s = Await(*slot); !s.ok()) return s;
    slot->state = SlotState::kAcquired;
  }
  stats_.acquire_wait_seconds += SecondsSince(t0);
  if (hit) ++stats_.staging_hits;
  return Staged(*slot, entry);
}

absl::StatusOr<StagedEntry> NvmeStateStore::AcquireForOverwrite(int entry) {
  if (!status_.ok()) return status_;
  if (absl::Status s = CheckHeld(entry); !s.ok()) return s;
  Slot* slot = FindSlot(entry);
  if (slot != nullptr) {
    if (slot->state == SlotState::kAcquired) {
      return absl::FailedPreconditionError(absl::StrCat("entry ", entry, " is already acquired"));
    }
    // A pending write of this entry must land before a newer one can follow it.
    if (absl::Status s = Await(*slot); !s.ok()) return s;
  } else {
    absl::StatusOr<Slot*> taken = TakeSlot(/*may_wait=*/true);
    if (!taken.ok()) return taken.status();
    slot = *taken;
    slot->entry = entry;
    slot->region = current_region(entry);
  }
  slot->state = SlotState::kAcquired;
  return Staged(*slot, entry);
}

StagedEntry NvmeStateStore::Staged(Slot& slot, int entry) {
  slot.last_use = ++clock_;
  StagedEntry staged{entry, entries_[entry].elements, {}};
  for (int a = 0; a < options_.arrays_per_entry; ++a) {
    staged.arrays.push_back(
        reinterpret_cast<float*>(slot.buffer.data_as<char>() + a * entries_[entry].array_bytes));
  }
  return staged;
}

absl::StatusOr<NvmeStateStore::Slot*> NvmeStateStore::SlotToRelease(int entry) {
  if (absl::Status s = CheckEntry(entry); !s.ok()) return s;
  Slot* slot = FindSlot(entry);
  if (slot == nullptr || slot->state != SlotState::kAcquired) {
    return absl::FailedPreconditionError(absl::StrCat("entry ", entry, " is not acquired"));
  }
  if (!status_.ok()) {
    slot->state = SlotState::kFree;
    slot->entry = -1;
    return status_;
  }
  return slot;
}

absl::Status NvmeStateStore::Release(int entry, bool dirty) {
  absl::StatusOr<Slot*> acquired = SlotToRelease(entry);
  if (!acquired.ok()) return acquired.status();
  Slot* slot = *acquired;
  if (!dirty) {
    slot->state = SlotState::kFree;
    return absl::OkStatus();
  }
  return WriteBack(*slot);
}

absl::Status NvmeStateStore::ReleaseToAlternate(int entry) {
  if (absl::Status s = CheckEntry(entry); !s.ok()) return s;
  if (parity_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ReleaseToAlternate(", entry, ") on ", path(), ", a file without alternate regions"));
  }
  absl::StatusOr<Slot*> acquired = SlotToRelease(entry);
  if (!acquired.ok()) return acquired.status();
  Slot* slot = *acquired;
  const int alternate = 1 - parity_[entry];
  // An older copy of the alternate region (a discarded speculation) must neither serve a later
  // Commit's reads nor land after this write.
  for (Slot& other : slots_) {
    if (&other == slot || other.entry != entry || other.region != alternate) continue;
    if (absl::Status s = Await(other); !s.ok()) return s;
    other.entry = -1;
  }
  slot->region = alternate;
  return WriteBack(*slot);
}

void NvmeStateStore::Commit(int entry) { parity_[entry] ^= 1; }

absl::Status NvmeStateStore::WriteBack(Slot& slot_ref) {
  Slot* slot = &slot_ref;
  const EntryLayout& e = entries_[slot->entry];
  const size_t used = e.elements * sizeof(float);
  for (int a = 0; a < options_.arrays_per_entry; ++a) {
    std::memset(slot->buffer.data_as<char>() + a * e.array_bytes + used, 0, e.array_bytes - used);
  }
  slot->state = SlotState::kWriting;
  writes_.push_back(slot);
  Transfer(*slot, IoOp::kWrite);
  const auto t0 = std::chrono::steady_clock::now();
  while (static_cast<int>(writes_.size()) > options_.max_writes_in_flight) {
    if (absl::Status s = Await(*writes_.front()); !s.ok()) return s;
  }
  stats_.release_wait_seconds += SecondsSince(t0);
  return absl::OkStatus();
}

absl::Status NvmeStateStore::Flush() {
  for (Slot& slot : slots_) {
    if (!slot.pending.empty()) (void)Await(slot);
  }
  if (!status_.ok()) return status_;
  if (absl::Status s = file_.Sync(); !s.ok()) status_ = s;
  return status_;
}

}  // namespace megatrain::engine::tiers
