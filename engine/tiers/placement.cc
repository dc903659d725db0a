// The placement planner: policy, refusal messages and the printed table.
#include "engine/tiers/placement.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace megatrain::engine::tiers {

const char* BufferKindName(BufferKind kind) {
  switch (kind) {
    case BufferKind::kMaster:
      return "master";
    case BufferKind::kM:
      return "m";
    case BufferKind::kV:
      return "v";
    case BufferKind::kGrad:
      return "grad";
    case BufferKind::kComputeCopy:
      return "compute_copy";
  }
  return "?";
}

const char* TierName(Tier tier) {
  switch (tier) {
    case Tier::kAbsent:
      return "-";
    case Tier::kPinned:
      return "pinned";
    case Tier::kRam:
      return "ram";
    case Tier::kNvme:
      return "nvme";
  }
  return "?";
}

std::string FormatBytes(uint64_t bytes) {
  return absl::StrFormat("%d B (%.2f GiB)", bytes, static_cast<double>(bytes) / (1ull << 30));
}

namespace {

std::string KindList(const std::vector<BufferKind>& kinds, const Placement& p) {
  std::vector<std::string> parts;
  for (BufferKind k : kinds) {
    parts.push_back(absl::StrCat(BufferKindName(k), " ", FormatBytes(p.of(k).bytes)));
  }
  return absl::StrJoin(parts, " + ");
}

void Recount(Placement& p, const PlacementOptions& options) {
  p.pinned_used = p.ram_used = p.nvme_used = 0;
  uint64_t staged_chunk_bytes = 0;
  for (const KindPlacement& k : p.kinds) {
    if (k.tier == Tier::kPinned) p.pinned_used += k.bytes;
    if (k.tier == Tier::kRam) p.ram_used += k.bytes;
    if (k.tier == Tier::kNvme) {
      p.nvme_used += k.bytes - k.ram_resident;
      p.ram_used += k.ram_resident;
      staged_chunk_bytes += std::min(k.largest_entry, options.chunk_bytes);
    }
  }
  p.staging_bytes = staged_chunk_bytes * static_cast<uint64_t>(options.staging_slots);
  p.ram_used += p.staging_bytes;
}

// Step 3 of the policy (placement.h): with the gradient kind on NVMe, keeps whole entries'
// gradients in RAM in forward order while the RAM budget holds them (staging shrinks with the
// largest entry left on NVMe, so each candidate is tried with a full recount).
void KeepWholeGradientsInRam(absl::Span<const EntryBytes> entries, uint64_t ram_budget,
                             const PlacementOptions& options, Placement& p) {
  KindPlacement& grad = p.kinds[static_cast<int>(BufferKind::kGrad)];
  std::vector<bool> in_ram(entries.size());
  for (size_t e = 0; e < entries.size(); ++e) in_ram[e] = entries[e].grad_stays_in_ram;
  const auto apply = [&] {
    grad.ram_resident = grad.largest_entry = 0;
    for (size_t e = 0; e < entries.size(); ++e) {
      const uint64_t bytes = entries[e][BufferKind::kGrad];
      if (in_ram[e]) {
        grad.ram_resident += bytes;
      } else {
        grad.largest_entry = std::max(grad.largest_entry, bytes);
      }
    }
    Recount(p, options);
  };
  for (size_t e = 0; e < entries.size(); ++e) {
    if (in_ram[e]) continue;
    in_ram[e] = true;
    apply();
    if (p.ram_used > ram_budget) {
      in_ram[e] = false;
      apply();
      break;
    }
    p.grad_kept_entries.push_back(static_cast<int>(e));
  }
  if (grad.ram_resident == grad.bytes) {
    // Every gradient fits: the kind is back in (pageable) RAM, with no file and no staging.
    grad.tier = Tier::kRam;
    grad.ram_resident = 0;
    p.grad_kept_entries.clear();
    Recount(p, options);
    return;
  }
  for (size_t e = 0; e < entries.size(); ++e) {
    if (in_ram[e]) p.grad_ram_entries.push_back(static_cast<int>(e));
  }
}

// With options.speculative_update, the pageable RAM the gradients should leave to the
// speculative update's alternate arrays, when `move` is the gradients' (step 2): its whole
// second copy fits the budgets once the gradients are on NVMe (its NVMe part beside them), so
// moving them makes the room that step 3 then keeps for it. 0 otherwise.
uint64_t GradientRoomForAlternates(const Placement& p, const std::vector<BufferKind>& move,
                                   const PlacementOptions& options) {
  if (!options.speculative_update || move != std::vector<BufferKind>{BufferKind::kGrad}) return 0;
  if (p.tier(BufferKind::kGrad) == Tier::kNvme) return 0;
  Placement moved = p;
  moved.kinds[static_cast<int>(BufferKind::kGrad)].tier = Tier::kNvme;
  Recount(moved, options);
  const AlternateStateBytes alternates = AlternateStateBytesOf(moved);
  return AlternateStateFits(moved, alternates) ? alternates.pageable : 0;
}

// "entries 1-12, 14's", "entry 3's".
std::string DescribeEntries(const std::vector<int>& sorted) {
  std::vector<std::string> runs;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    runs.push_back(i == j ? absl::StrCat(sorted[i]) : absl::StrCat(sorted[i], "-", sorted[j]));
    i = j + 1;
  }
  return absl::StrCat(sorted.size() == 1 ? "entry " : "entries ", absl::StrJoin(runs, ", "),
                      "'s");
}

// Whose bytes a kind on NVMe keeps in RAM, for the table: "the embedding's and entries 1-12's".
std::string RamResidentWhose(const Placement& p, int kind) {
  // Only the embedding's entry is marked to stay in RAM (its rows are used on the host).
  if (static_cast<BufferKind>(kind) != BufferKind::kGrad || p.grad_kept_entries.empty()) {
    return "the embedding's";
  }
  const bool embedding = p.grad_ram_entries.size() > p.grad_kept_entries.size();
  return absl::StrCat(embedding ? "the embedding's and " : "",
                      DescribeEntries(p.grad_kept_entries));
}

}  // namespace

bool Placement::grad_on_nvme(int entry) const {
  return tier(BufferKind::kGrad) == Tier::kNvme &&
         !std::binary_search(grad_ram_entries.begin(), grad_ram_entries.end(), entry);
}

absl::StatusOr<Placement> PlanPlacement(absl::Span<const EntryBytes> entries,
                                        const TierBudgets& budgets,
                                        const PlacementOptions& options) {
  const bool have_nvme = !budgets.nvme_dir.empty();
  if (have_nvme && budgets.nvme_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("nvme_bytes=0 with nvme_dir=", budgets.nvme_dir, ": give the tier a size"));
  }
  if (!have_nvme && budgets.nvme_bytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("nvme_bytes=", budgets.nvme_bytes, " without an nvme_dir"));
  }
  if (options.chunk_bytes == 0 || options.chunk_bytes % kNvmeChunkQuantumBytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat("nvme_chunk_bytes=", options.chunk_bytes,
                                                   " must be a positive multiple of ",
                                                   kNvmeChunkQuantumBytes, " (256 KiB)"));
  }
  if (options.staging_slots < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("staging_slots=", options.staging_slots, " must be at least 1"));
  }
  if (!have_nvme && (options.states_on_nvme || options.master_on_nvme || options.grad_on_nvme ||
                     options.compute_copy_on_nvme)) {
    return absl::InvalidArgumentError(
        "states_on_nvme/master_on_nvme/grad_on_nvme/compute_copy_on_nvme need an nvme_dir");
  }
  const bool master_asked = options.master_on_nvme || options.compute_copy_on_nvme;
  Placement p;
  p.budgets = budgets;
  // What an fp32 compute copy of the master would hold in RAM when on NVMe, and its largest
  // NVMe-resident entry.
  uint64_t fp32_copy_resident = 0, fp32_copy_largest = 0;
  for (const EntryBytes& e : entries) {
    for (int k = 0; k < kNumBufferKinds; ++k) {
      p.kinds[k].bytes += e.bytes[k];
      const bool stays = (e.grad_stays_in_ram && k == static_cast<int>(BufferKind::kGrad)) ||
                         (e.compute_copy_stays_in_ram &&
                          k == static_cast<int>(BufferKind::kComputeCopy));
      if (stays) {
        p.kinds[k].ram_resident += e.bytes[k];
      } else {
        p.kinds[k].largest_entry = std::max(p.kinds[k].largest_entry, e.bytes[k]);
      }
    }
    if (e.compute_copy_stays_in_ram) {
      fp32_copy_resident += e[BufferKind::kMaster];
    } else {
      fp32_copy_largest = std::max(fp32_copy_largest, e[BufferKind::kMaster]);
    }
  }
  const auto kind = [&](BufferKind k) -> KindPlacement& { return p.kinds[static_cast<int>(k)]; };
  if (master_asked && kind(BufferKind::kComputeCopy).bytes == 0) {
    // The master is the copy-in source here: it can leave RAM only behind an fp32 copy.
    kind(BufferKind::kComputeCopy).bytes = kind(BufferKind::kMaster).bytes;
    kind(BufferKind::kComputeCopy).largest_entry = fp32_copy_largest;
    kind(BufferKind::kComputeCopy).ram_resident = fp32_copy_resident;
    p.compute_copy_fp32 = true;
  }
  const bool master_is_copy_source = kind(BufferKind::kComputeCopy).bytes == 0;

  // 1. Copy endpoints: pinned while it lasts, pageable staging otherwise.
  std::vector<BufferKind> endpoints = {
      BufferKind::kGrad, master_is_copy_source ? BufferKind::kMaster : BufferKind::kComputeCopy};
  // The executors' staging is allocated from the same budget: the store takes what is left.
  p.pinned_reserved = options.pinned_reserved;
  uint64_t pinned_left = budgets.pinned_ram > options.pinned_reserved
                             ? budgets.pinned_ram - options.pinned_reserved
                             : 0;
  for (BufferKind k : endpoints) {
    KindPlacement& kp = kind(k);
    if (kp.bytes == 0) continue;
    if (kp.bytes <= pinned_left) {
      kp.tier = Tier::kPinned;
      pinned_left -= kp.bytes;
    } else {
      kp.tier = Tier::kRam;
      kp.wanted_pinned = true;
    }
  }
  // 2. Everything else in pageable RAM, then to NVMe while RAM overflows.
  for (BufferKind k : {BufferKind::kMaster, BufferKind::kM, BufferKind::kV}) {
    if (kind(k).tier == Tier::kAbsent && kind(k).bytes > 0) kind(k).tier = Tier::kRam;
  }
  Recount(p, options);
  if (have_nvme) {
    struct Move {
      std::vector<BufferKind> kinds;
      bool asked;
    };
    std::vector<Move> moves = {
        {{BufferKind::kM, BufferKind::kV},
         options.states_on_nvme || master_asked || options.grad_on_nvme}};
    if (!master_is_copy_source) moves.push_back({{BufferKind::kMaster}, master_asked});
    moves.push_back({{BufferKind::kGrad}, options.grad_on_nvme || options.compute_copy_on_nvme});
    if (!master_is_copy_source) {
      moves.push_back({{BufferKind::kComputeCopy}, options.compute_copy_on_nvme});
    }
    for (const Move& move : moves) {
      if (!move.asked && p.ram_used + GradientRoomForAlternates(p, move.kinds, options) <=
                             budgets.ram) {
        continue;
      }
      for (BufferKind k : move.kinds) {
        if (kind(k).bytes == 0) continue;
        if (kind(k).tier == Tier::kPinned) pinned_left += kind(k).bytes;
        kind(k).tier = Tier::kNvme;
        kind(k).wanted_pinned = false;
      }
      // Pinned RAM the gradients left goes to the other copy endpoint if it now fits.
      for (BufferKind k : endpoints) {
        KindPlacement& kp = kind(k);
        if (kp.tier == Tier::kRam && kp.wanted_pinned && kp.bytes <= pinned_left) {
          kp.tier = Tier::kPinned;
          kp.wanted_pinned = false;
          pinned_left -= kp.bytes;
        }
      }
      Recount(p, options);
    }
    // 3. The RAM left over keeps whole entries' gradients.
    const bool grad_asked = options.grad_on_nvme || options.compute_copy_on_nvme;
    if (kind(BufferKind::kGrad).tier == Tier::kNvme && !grad_asked) {
      // The speculative update's alternate arrays come first: the gradients kept in RAM save
      // their NVMe round trip, but the speculation moves the whole optimizer pass off the
      // step's critical path (the mixed form's alternate master is what this leaves room for).
      uint64_t ram_for_gradients = budgets.ram;
      if (options.speculative_update) {
        const AlternateStateBytes alternates = AlternateStateBytesOf(p);
        if (AlternateStateFits(p, alternates)) ram_for_gradients -= alternates.pageable;
      }
      KeepWholeGradientsInRam(entries, ram_for_gradients, options, p);
    } else if (kind(BufferKind::kGrad).tier == Tier::kNvme) {
      for (size_t e = 0; e < entries.size(); ++e) {
        if (entries[e].grad_stays_in_ram) p.grad_ram_entries.push_back(static_cast<int>(e));
      }
    }
  }
  // 4. Refuse what does not fit, saying how much is missing and for what.
  std::vector<std::string> missing;
  if (p.ram_used > budgets.ram) {
    std::vector<BufferKind> in_ram;
    for (int k = 0; k < kNumBufferKinds; ++k) {
      if (p.kinds[k].tier == Tier::kRam) in_ram.push_back(static_cast<BufferKind>(k));
    }
    std::string needed_for = KindList(in_ram, p);
    if (p.staging_bytes > 0) {
      absl::StrAppend(&needed_for, in_ram.empty() ? "" : " + ", "NVMe staging ",
                      FormatBytes(p.staging_bytes));
    }
    std::string msg = absl::StrCat("needs ", FormatBytes(p.ram_used - budgets.ram),
                                   " more of RAM (ram=", budgets.ram, ") for ", needed_for);
    for (BufferKind k : in_ram) {
      if (kind(k).wanted_pinned) {
        absl::StrAppend(
            &msg, "; ", BufferKindName(k), " did not fit pinned_ram=", budgets.pinned_ram,
            p.pinned_reserved > 0 ? absl::StrCat(" less the executor staging ", p.pinned_reserved)
                                  : "");
      }
    }
    absl::StrAppend(&msg, have_nvme ? "" : "; no nvme_dir is set, so nothing can move to NVMe");
    missing.push_back(msg);
  }
  if (p.nvme_used > budgets.nvme_bytes) {
    std::vector<BufferKind> on_nvme;
    for (int k = 0; k < kNumBufferKinds; ++k) {
      if (p.kinds[k].tier == Tier::kNvme) on_nvme.push_back(static_cast<BufferKind>(k));
    }
    missing.push_back(absl::StrCat("needs ", FormatBytes(p.nvme_used - budgets.nvme_bytes),
                                   " more of NVMe (nvme_bytes=", budgets.nvme_bytes, " in ",
                                   budgets.nvme_dir, ") for ", KindList(on_nvme, p)));
  }
  if (!missing.empty()) {
    uint64_t total = 0;
    for (const KindPlacement& k : p.kinds) total += k.bytes;
    return absl::ResourceExhaustedError(absl::StrCat(
        "the parameter store does not fit the memory budgets: ", absl::StrJoin(missing, "; "),
        ". The store holds ", FormatBytes(total), "; budgets: pinned_ram=", budgets.pinned_ram,
        " ram=", budgets.ram, " nvme_bytes=", budgets.nvme_bytes));
  }
  return p;
}

std::string Placement::Table() const {
  std::string out = absl::StrFormat("%-13s %-7s %s\n", "buffer", "tier", "bytes");
  for (int k = 0; k < kNumBufferKinds; ++k) {
    const KindPlacement& kp = kinds[k];
    if (kp.tier == Tier::kAbsent) continue;
    const bool fp32_copy =
        compute_copy_fp32 && static_cast<BufferKind>(k) == BufferKind::kComputeCopy;
    absl::StrAppend(
        &out, absl::StrFormat("%-13s %-7s %s%s%s%s\n", BufferKindName(static_cast<BufferKind>(k)),
                              TierName(kp.tier), FormatBytes(kp.bytes),
                              fp32_copy ? "  (fp32: the master is on NVMe)" : "",
                              kp.tier == Tier::kNvme && kp.ram_resident > 0
                                  ? absl::StrCat("  (", FormatBytes(kp.ram_resident),
                                                 " of it in RAM: ", RamResidentWhose(*this, k), ")")
                                  : "",
                              kp.wanted_pinned ? "  (pageable: pinned budget full)" : ""));
  }
  if (staging_bytes > 0) {
    absl::StrAppend(&out, absl::StrFormat("%-13s %-7s %s\n", "nvme_staging", "ram",
                                          FormatBytes(staging_bytes)));
  }
  if (!speculation_note.empty()) absl::StrAppend(&out, speculation_note, "\n");
  if (pinned_reserved > 0) {
    absl::StrAppend(&out, absl::StrFormat("%-13s %-7s %s\n", "exec_staging", "pinned",
                                          FormatBytes(pinned_reserved)));
  }
  absl::StrAppend(
      &out,
      absl::StrFormat(
          "budget use: pinned %d/%d%s, ram %d/%d, nvme %d/%d%s\n", pinned_used, budgets.pinned_ram,
          pinned_reserved > 0 ? absl::StrCat(" (+", pinned_reserved, " executor staging)") : "",
          ram_used, budgets.ram, nvme_used, budgets.nvme_bytes,
          budgets.nvme_dir.empty() ? "" : " in " + budgets.nvme_dir));
  return out;
}

}  // namespace megatrain::engine::tiers
