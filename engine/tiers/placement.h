// The placement planner of the memory tiers: decides, before the first step, in which tier
// (pinned RAM, pageable RAM, NVMe file) each kind of parameter-store buffer lives under the
// user's byte budgets, prints the table and refuses plans that do not fit.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace megatrain::engine::tiers {

enum class BufferKind { kMaster = 0, kM, kV, kGrad, kComputeCopy };
inline constexpr int kNumBufferKinds = 5;
const char* BufferKindName(BufferKind kind);

enum class Tier { kAbsent, kPinned, kRam, kNvme };
const char* TierName(Tier tier);

// One parameter-store entry's buffer sizes in bytes, indexed by BufferKind. compute_copy is 0 on
// the CPU device, where the fp32 master is what the weights stream from (unless master_on_nvme
// asks for an fp32 compute copy, which PlanPlacement then adds).
struct EntryBytes {
  std::array<uint64_t, kNumBufferKinds> bytes{};
  // The gradient stays in RAM even when the gradients go to NVMe: the
  // embedding's, a scatter-add of the batch's rows on the host.
  bool grad_stays_in_ram = false;
  // Likewise the compute copy (the embedding's: its rows are gathered on the host).
  bool compute_copy_stays_in_ram = false;
  uint64_t& operator[](BufferKind k) { return bytes[static_cast<int>(k)]; }
  uint64_t operator[](BufferKind k) const { return bytes[static_cast<int>(k)]; }
};

// The user's budgets. pinned_ram and ram are disjoint: host memory used by the store is at most
// pinned_ram + ram (plus the fixed overhead of docs/operations.md).
struct TierBudgets {
  uint64_t pinned_ram = 0;  // page-locked bytes (copy endpoints)
  uint64_t ram = 0;         // pageable bytes
  std::string nvme_dir;     // empty = no NVMe tier
  uint64_t nvme_bytes = 0;  // bytes the tier may occupy in nvme_dir
};

// The chunk NVMe traffic and the host optimizer work in, per array: its default, and the unit
// it must be a multiple of (the gradient norm's 64 Ki-element chunk of fp32, so a norm summed
// chunk by chunk has the bits of a whole one; engine/optimizer/grad_norm.h).
inline constexpr uint64_t kDefaultNvmeChunkBytes = uint64_t{64} << 20;
inline constexpr uint64_t kNvmeChunkQuantumBytes = uint64_t{256} << 10;

struct PlacementOptions {
  // RAM staging slots per NVMe-resident kind (reads ahead, the chunk being updated, write-backs
  // in flight), each one chunk: min(chunk_bytes, the kind's largest entry). Matches
  // NvmeStateStoreOptions and StorePlacement::nvme_chunk_bytes.
  int staging_slots = 5;
  uint64_t chunk_bytes = kDefaultNvmeChunkBytes;
  // Every fp32 gradient on NVMe (with m and v) but the grad_stays_in_ram entries', even when
  // RAM could hold them (no RAM left over keeps whole entries' gradients, see PlanPlacement).
  bool grad_on_nvme = false;
  // The compute copy on NVMe too (implies master_on_nvme: on the CPU device the fp32 copy exists
  // only then), even when RAM could hold it.
  bool compute_copy_on_nvme = false;
  bool states_on_nvme = false;  // put m and v on NVMe even when RAM could hold them
  // Also the master (with m and v). Where the master is the compute copy (compute_copy bytes 0:
  // the CPU device), a separate fp32 compute copy of the master's size is added as the copy
  // endpoint, so the master can leave RAM; it costs as much RAM as the master saves.
  bool master_on_nvme = false;
  // The run asks for the speculative update (TrainerOptions::speculative_update): step 3 of the
  // policy leaves the RAM its alternate arrays need (ReserveAlternateStateRegions) when the
  // budgets hold that second copy, instead of filling it with gradients.
  bool speculative_update = false;
  // Pinned bytes set aside before the store is placed: the executors' own pinned staging
  // (StreamingExecutor::PinnedStagingBytes per device), allocated from the same budget. The
  // store's copy endpoints get what is left and fall back to pageable RAM when it is full.
  uint64_t pinned_reserved = 0;
};

struct KindPlacement {
  Tier tier = Tier::kAbsent;
  uint64_t bytes = 0;          // sum over entries
  uint64_t largest_entry = 0;  // bytes of the largest entry (of those that can go to NVMe)
  // Bytes that stay in RAM when the kind is on NVMe (the embedding's gradient and the
  // gradients of Placement::grad_kept_entries).
  uint64_t ram_resident = 0;
  bool wanted_pinned = false;  // a copy endpoint that did not fit the pinned budget
};

struct Placement {
  std::array<KindPlacement, kNumBufferKinds> kinds;
  uint64_t staging_bytes = 0;  // pageable RAM for NVMe staging slots
  uint64_t pinned_used = 0;    // by the store
  uint64_t pinned_reserved = 0;  // PlacementOptions::pinned_reserved (not in pinned_used)
  uint64_t ram_used = 0;         // including staging
  uint64_t nvme_used = 0;
  // The compute copy is an fp32 copy of the master added for master_on_nvme on the CPU device.
  bool compute_copy_fp32 = false;
  TierBudgets budgets;
  // Bytes of the NVMe state file's alternate regions (ReserveAlternateStateRegions: of the kinds
  // on NVMe), counted in nvme_used; and the Table line saying whether the speculative update has
  // its second copy.
  uint64_t alternate_state_bytes = 0;
  // The kinds in RAM (master, m and v; or the master alone beside m and v on NVMe): their
  // alternate arrays (each in its kind's tier), counted in pinned_used and ram_used.
  uint64_t alternate_ram_bytes = 0;
  std::string speculation_note;
  // When the gradient kind is on NVMe, the entries whose gradient stays in RAM, ascending: the
  // grad_stays_in_ram ones and grad_kept_entries. Empty otherwise.
  std::vector<int> grad_ram_entries;
  // Of those, the ones the RAM left over holds (whole entries in forward order).
  std::vector<int> grad_kept_entries;

  const KindPlacement& of(BufferKind k) const { return kinds[static_cast<int>(k)]; }
  Tier tier(BufferKind k) const { return of(k).tier; }
  // The per-entry answer for the gradients: on NVMe unless the kind is elsewhere or the entry
  // is one of grad_ram_entries.
  bool grad_on_nvme(int entry) const;
  bool any_on_nvme() const { return nvme_used > 0; }
  // One row per buffer kind (tier, bytes), the staging row and the use of each budget.
  std::string Table() const;
};

// The speculative update (TrainerOptions::speculative_update) writes the new master, m and v
// out of place, into a second copy of them, and commits by making that copy current. Each kind's
// copy goes where the kind is (placement_alternates.cc):
//  - on NVMe (master, m and v; or m and v beside a master in RAM): alternate regions of the NVMe
//    state file, counted in nvme_used (alternate_state_bytes);
//  - in RAM (master, m and v, pinned or pageable, any mix; or the master alone beside m and v on
//    NVMe): alternate arrays, each in its kind's tier (the master's may be a copy endpoint, so it
//    keeps its pinning), counted in pinned_used and ram_used (alternate_ram_bytes);
//  - any other placement (the master on NVMe with m or v in RAM, m and v apart): off.
// It is on when the budgets hold every copy. Returns whether it is on; either way
// placement.Table() then says so (speculation_note: which copies went where, or why it is off
// with the bytes it would need of each tier short of room).
bool ReserveAlternateStateRegions(Placement& placement);
// The conditions of the three forms: the master, m and v all on NVMe; all in RAM; the master in
// RAM with m and v on NVMe (the mixed form).
bool MasterAndStatesOnNvme(const Placement& placement);
bool MasterAndStatesInRam(const Placement& placement);
bool MasterInRamStatesOnNvme(const Placement& placement);
// The second copy's bytes in each tier for the placement's form (all 0 where it cannot
// speculate), and whether the budgets have that room left.
struct AlternateStateBytes {
  uint64_t nvme = 0;
  uint64_t pinned = 0;
  uint64_t pageable = 0;
};
AlternateStateBytes AlternateStateBytesOf(const Placement& placement);
bool AlternateStateFits(const Placement& placement, const AlternateStateBytes& bytes);

// Deterministic policy (docs/operations.md):
//  1. Copy endpoints (gradient slabs, then the compute copy, which is the master on the CPU
//     device) go to pinned RAM while the pinned budget less options.pinned_reserved lasts, else to
//     pageable RAM (staging through pageable memory: slower copies, never a pinned allocation
//     beyond the budget).
//  2. Other buffers go to pageable RAM; while RAM overflows (or when asked) kinds move to NVMe
//     least-moved first, so the fastest tier keeps what moves most per step: m and v, then the
//     master if it is not a copy endpoint (never before m and v: it streams with them), then the
//     gradient (written every micro-batch, read once; the embedding's stays in RAM). The compute
//     copy, read every micro-batch, stays in RAM. NVMe-resident kinds need staging_slots chunks
//     of RAM each. master_on_nvme on the CPU device first adds the fp32 compute copy (see
//     PlacementOptions).
//  3. When the gradients went to NVMe because RAM overflowed (not asked by grad_on_nvme or
//     compute_copy_on_nvme), the RAM budget left after everything else (staging included) keeps
//     the gradients of whole entries in forward order (entry 0, 1, ...: the optimizer pass reads
//     them first, backward writes them last), stopping at the first entry that does not fit:
//     grad_kept_entries. If every entry fits, the kind is back in pageable RAM. With
//     options.speculative_update the RAM the speculative update's alternate arrays need is left
//     out of that budget first, when the budgets hold its whole second copy (AlternateStateFits).
//  4. A plan that still does not fit fails with RESOURCE_EXHAUSTED: "needs X more bytes of <tier>
//     for <kinds>". Bad budgets fail with INVALID_ARGUMENT naming the field.
absl::StatusOr<Placement> PlanPlacement(absl::Span<const EntryBytes> entries,
                                        const TierBudgets& budgets,
                                        const PlacementOptions& options = {});

// "1234567890 B (1.15 GiB)".
std::string FormatBytes(uint64_t bytes);

}  // namespace megatrain::engine::tiers
