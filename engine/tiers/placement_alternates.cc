// The speculative update's second copy of the master, m and v (ReserveAlternateStateRegions):
// which of the three placements that can speculate a Placement is, and the room it takes.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/tiers/placement.h"

namespace megatrain::engine::tiers {

namespace {

constexpr BufferKind kStateKinds[] = {BufferKind::kMaster, BufferKind::kM, BufferKind::kV};

bool InRam(Tier tier) { return tier == Tier::kPinned || tier == Tier::kRam; }

uint64_t Left(uint64_t budget, uint64_t used) { return budget > used ? budget - used : 0; }

// "master/m/v", "m/v" or "master": the kinds of the state placed in `where`.
std::string KindsIn(const Placement& p, bool (*where)(Tier), int* count) {
  std::vector<std::string> names;
  for (BufferKind k : kStateKinds) {
    if (where(p.tier(k))) names.push_back(BufferKindName(k));
  }
  *count = static_cast<int>(names.size());
  return absl::StrJoin(names, "/");
}

bool OnNvme(Tier tier) { return tier == Tier::kNvme; }

}  // namespace

bool MasterAndStatesOnNvme(const Placement& p) {
  for (BufferKind k : kStateKinds) {
    if (!OnNvme(p.tier(k))) return false;
  }
  return true;
}

bool MasterAndStatesInRam(const Placement& p) {
  for (BufferKind k : kStateKinds) {
    if (!InRam(p.tier(k))) return false;
  }
  return true;
}

bool MasterInRamStatesOnNvme(const Placement& p) {
  return InRam(p.tier(BufferKind::kMaster)) && OnNvme(p.tier(BufferKind::kM)) &&
         OnNvme(p.tier(BufferKind::kV));
}

namespace {

bool CanSpeculate(const Placement& p) {
  return MasterAndStatesOnNvme(p) || MasterAndStatesInRam(p) || MasterInRamStatesOnNvme(p);
}

}  // namespace

AlternateStateBytes AlternateStateBytesOf(const Placement& p) {
  // Each kind's second copy goes where the kind is: a region of the state file on NVMe, or an
  // array in its RAM tier (the master's may be a copy endpoint, so it keeps its pinning).
  AlternateStateBytes b;
  if (!CanSpeculate(p)) return b;
  for (BufferKind k : kStateKinds) {
    const uint64_t bytes = p.of(k).bytes;
    (OnNvme(p.tier(k)) ? b.nvme : p.tier(k) == Tier::kPinned ? b.pinned : b.pageable) += bytes;
  }
  return b;
}

bool AlternateStateFits(const Placement& p, const AlternateStateBytes& b) {
  return b.nvme <= Left(p.budgets.nvme_bytes, p.nvme_used) &&
         b.pinned <= Left(Left(p.budgets.pinned_ram, p.pinned_reserved), p.pinned_used) &&
         b.pageable <= Left(p.budgets.ram, p.ram_used);
}

bool ReserveAlternateStateRegions(Placement& p) {
  if (!CanSpeculate(p)) {
    p.speculation_note =
        "speculative update off: the master, m and v are neither all on NVMe, nor all in RAM, nor "
        "the master in RAM with m and v on NVMe";
    return false;
  }
  const AlternateStateBytes bytes = AlternateStateBytesOf(p);
  const uint64_t nvme = bytes.nvme, pinned = bytes.pinned, pageable = bytes.pageable;
  int nvme_kinds = 0, ram_kinds = 0;
  const std::string regions = absl::StrCat(KindsIn(p, OnNvme, &nvme_kinds), " regions");
  const std::string arrays = KindsIn(p, InRam, &ram_kinds);
  const std::string arrays_named = absl::StrCat(arrays, ram_kinds == 1 ? " array" : " arrays");

  const uint64_t nvme_left = Left(p.budgets.nvme_bytes, p.nvme_used);
  const uint64_t pinned_left = Left(Left(p.budgets.pinned_ram, p.pinned_reserved), p.pinned_used);
  const uint64_t ram_left = Left(p.budgets.ram, p.ram_used);
  std::vector<std::string> short_of;
  if (nvme > nvme_left) {
    short_of.push_back(
        absl::StrCat(FormatBytes(nvme), " more of NVMe (", FormatBytes(nvme_left), " left)"));
  }
  if (pinned > pinned_left) {
    short_of.push_back(absl::StrCat(FormatBytes(pinned), " more of pinned RAM (",
                                    FormatBytes(pinned_left), " left)"));
  }
  if (pageable > ram_left) {
    short_of.push_back(
        absl::StrCat(FormatBytes(pageable), " more of RAM (", FormatBytes(ram_left), " left)"));
  }
  std::vector<std::string> what;
  if (nvme_kinds > 0) what.push_back(regions);
  if (ram_kinds > 0) what.push_back(arrays_named);
  if (!short_of.empty()) {
    // Short of RAM with m and v already on NVMe: the master can join them there, and its second
    // copy then takes NVMe instead of RAM (docs/benchmarks.md §9g measured that form).
    const bool master_could_move = MasterInRamStatesOnNvme(p) && (pinned > pinned_left ||
                                                                  pageable > ram_left);
    p.speculation_note = absl::StrCat(
        "speculative update off: its alternate ", absl::StrJoin(what, " and "), " need ",
        absl::StrJoin(short_of, " and "),
        master_could_move ? " (with master_on_nvme the master's second copy would go to NVMe "
                            "instead)"
                          : "");
    return false;
  }
  p.alternate_state_bytes = nvme;
  p.alternate_ram_bytes = pinned + pageable;
  p.nvme_used += nvme;
  p.pinned_used += pinned;
  p.ram_used += pageable;
  std::vector<std::string> where;
  if (nvme_kinds > 0) where.push_back(absl::StrCat(regions, " ", FormatBytes(nvme), " on NVMe"));
  if (ram_kinds > 0) {
    where.push_back(absl::StrCat(arrays_named, " ", FormatBytes(pinned + pageable), " in RAM (",
                                 pinned, " B pinned, ", pageable, " B pageable)"));
  }
  p.speculation_note =
      absl::StrCat("speculative update on: alternate ", absl::StrJoin(where, " and "));
  return true;
}

}  // namespace megatrain::engine::tiers
