// NvmeStateStore: per-entry optimizer state (m and v, optionally the master) kept in one O_DIRECT
// file on the NVMe tier and streamed through a bounded set of RAM staging slots, read ahead in
// entry order and written back asynchronously.
//
// Protocol (one optimizer pass over entries 0..n-1, on one thread):
//  1. Acquire(e) makes sure e's read is issued, then issues reads of the next read_ahead entries
//     after e (wrapping to the next pass) into free staging slots, then waits for e's read: while
//     entry e is updated, the next entries are already streaming in. Empty entries (0 elements:
//     another ZeRO-1 rank's, no bytes in this file) are passed over and not counted.
//  2. Release(e) zeroes the block padding and submits e's write-back; at most
//     max_writes_in_flight entries are being written, Release waits for the oldest beyond that.
//  3. A slot whose entry is asked for again before it was reused serves it from RAM (after its
//     write-back completes), so a read never overtakes a pending write of the same entry.
//  4. The first I/O error is sticky: every later call returns it (it names file and offset).
//  5. With alternate_regions (the trainer's speculative update) the file holds two regions and a
//     parity bit per entry says which one is current: Acquire reads the current region, Release
//     writes it; ReleaseToAlternate writes the other one instead, leaving the current state
//     intact, and Commit(entry) makes that write the current state. A staging slot remembers
//     the region its data belongs to, so a speculative copy never serves a read of the current
//     state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/tiers/aligned_buffer.h"
#include "engine/tiers/block_io.h"
#include "engine/tiers/direct_file.h"
#include "engine/tiers/nvme_tier_files.h"
#include "engine/tiers/uring_block_io.h"

namespace megatrain::engine::tiers {

struct NvmeStateStoreOptions {
  std::string dir;                                // on a block-backed filesystem (checked)
  std::string file_name = kOptimizerStateFileName;  // created inside dir
  int arrays_per_entry = 2;                       // m, v; 3 when the master streams too
  int read_ahead = 2;                             // entries read ahead of the one acquired
  int max_writes_in_flight = 2;                   // entries whose write-back may be pending
  bool read_ahead_wraps = true;                   // after the last entry, read 0, 1, ...
  size_t request_bytes = kDefaultBlockBytes;      // split transfers into requests of this size
  bool alternate_regions = false;                 // two regions per entry (protocol, 5.)

  int staging_slots() const { return read_ahead + 1 + max_writes_in_flight; }
};

// The staged arrays of one acquired entry: array(a) has `elements` floats, 4 KiB aligned.
struct StagedEntry {
  int entry = -1;
  size_t elements = 0;
  std::vector<float*> arrays;
  float* array(int a) const { return arrays[a]; }
};

struct NvmeStateStoreStats {
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t staging_hits = 0;        // acquires served from a staging slot without a read
  double acquire_wait_seconds = 0;  // time Acquire blocked on reads (the optimizer's stall)
  double release_wait_seconds = 0;  // time Release blocked on the write-back bound
};

class NvmeStateStore {
 public:
  enum class Init {
    kZero,          // a new file, every array zero (AdamW's m = v = 0)
    kOpenExisting,  // resume from a file of exactly this layout (a short file is refused)
  };

  // Checks the directory (CheckDirectIoDirectory), creates/opens the file and reserves its bytes,
  // so a full disk fails here. `io` must outlive the store.
  static absl::StatusOr<std::unique_ptr<NvmeStateStore>> Create(
      BlockIo& io, const NvmeStateStoreOptions& options, std::vector<size_t> entry_elements,
      Init init = Init::kZero);
  ~NvmeStateStore();  // waits for pending I/O

  // Starts reading `entry` into a free staging slot; a no-op when it is already staged or no slot
  // is free without waiting for a read.
  absl::Status Prefetch(int entry);
  // The entry's arrays in RAM, valid until Release(entry). At most staging_slots() - 1 entries
  // should be held at once (so read-ahead has room); holding all slots is FAILED_PRECONDITION.
  // `read_ahead` < 0 uses the options' read-ahead; 0 reads nothing ahead (a writer that knows
  // its own order prefetches what it needs).
  absl::StatusOr<StagedEntry> Acquire(int entry, int read_ahead = -1);
  // Like Acquire, for an entry about to be overwritten whole: no read is issued (a staged copy,
  // or one being read or written, is awaited and used). Nothing is read ahead. The arrays hold
  // whatever the slot held before; the caller writes every element before Release.
  absl::StatusOr<StagedEntry> AcquireForOverwrite(int entry);
  // Hands the entry back; when `dirty`, its arrays are written back asynchronously.
  absl::Status Release(int entry, bool dirty = true);
  // Alternate regions only: writes the acquired entry's arrays to the region that is not current
  // (the current state stays as it was) and hands the entry back.
  absl::Status ReleaseToAlternate(int entry);
  // Alternate regions only: the region last written by ReleaseToAlternate becomes the current
  // one. Call it only after such a write and before the entry is acquired again.
  void Commit(int entry);
  // Which region holds the entry's current state (0 without alternate regions).
  int current_region(int entry) const { return parity_.empty() ? 0 : parity_[entry]; }
  // Waits for every pending read and write; returns the first error. Then fdatasync.
  absl::Status Flush();

  int num_entries() const { return static_cast<int>(entries_.size()); }
  int staging_slots() const { return static_cast<int>(slots_.size()); }
  uint64_t staging_bytes() const;
  uint64_t file_bytes() const { return file_bytes_; }
  const std::string& path() const { return file_.path(); }
  const NvmeStateStoreStats& stats() const { return stats_; }
  int arrays_per_entry() const { return options_.arrays_per_entry; }
  // Where array `array` of `entry` starts in the file and how many bytes it spans (block-rounded):
  // what an I/O error's offset is matched against.
  uint64_t array_offset(int entry, int array) const {
    return entries_[entry].offset + static_cast<uint64_t>(array) * entries_[entry].array_bytes;
  }
  uint64_t array_bytes(int entry) const { return entries_[entry].array_bytes; }

 private:
  enum class SlotState { kFree, kReading, kAcquired, kWriting };
  struct Slot {
    AlignedBuffer buffer;
    SlotState state = SlotState::kFree;
    int entry = -1;  // the entry whose data the slot holds or is reading (-1: none)
    int region = 0;  // which of the entry's regions that data belongs to
    std::vector<IoFuture> pending;
    uint64_t last_use = 0;
  };
  struct EntryLayout {
    size_t elements = 0;
    uint64_t offset = 0;       // in the file
    uint64_t array_bytes = 0;  // elements * 4 rounded up to the block
  };

  NvmeStateStore(BlockIo& io, NvmeStateStoreOptions options, DirectFile file,
                 std::vector<EntryLayout> entries, uint64_t file_bytes);
  absl::Status CheckEntry(int entry) const;
  // CheckEntry, and FAILED_PRECONDITION for an empty entry (no bytes here to stage).
  absl::Status CheckHeld(int entry) const;
  // The slot holding or moving the entry's data of `region`; -1 = the current region.
  Slot* FindSlot(int entry, int region = -1);
  // The acquired slot of `entry` for Release/ReleaseToAlternate; after an earlier I/O error the
  // slot is freed and that error returned.
  absl::StatusOr<Slot*> SlotToRelease(int entry);
  // A slot to stage a new entry in: a free one (least recently used first), else, when
  // `may_wait`, the oldest write-back or read-ahead after waiting for it. Null when none.
  absl::StatusOr<Slot*> TakeSlot(bool may_wait);
  absl::Status Await(Slot& slot);  // waits for the slot's I/O; records the first error
  void Transfer(Slot& slot, IoOp op);
  absl::Status StartRead(int entry, bool may_wait);
  // Zeroes the block padding of an acquired slot and submits its write (to slot.region).
  absl::Status WriteBack(Slot& slot);
  StagedEntry Staged(Slot& slot, int entry);

  BlockIo& io_;
  NvmeStateStoreOptions options_;
  DirectFile file_;
  std::vector<EntryLayout> entries_;
  uint64_t file_bytes_ = 0;
  std::vector<Slot> slots_;
  std::deque<Slot*> writes_;  // slots being written back, oldest first
  uint64_t clock_ = 0;
  uint64_t region_bytes_ = 0;     // offset of region 1 (alternate_regions)
  std::vector<uint8_t> parity_;  // per entry, the current region (alternate_regions)
  absl::Status status_;
  NvmeStateStoreStats stats_;
};

}  // namespace megatrain::engine::tiers
