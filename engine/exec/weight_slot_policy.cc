// WeightSlotPolicy implementation.
#include "engine/exec/weight_slot_policy.h"

#include <algorithm>
#include <set>

namespace megatrain::engine {

WeightSlotPolicy::WeightSlotPolicy(int num_slots) : slots_(static_cast<size_t>(num_slots)) {}

WeightSlotPolicy::Decision WeightSlotPolicy::Place(const std::vector<int>& entries,
                                                   uint64_t version) {
  ++clock_;
  for (int i = 0; i < num_slots(); ++i) {
    Slot& s = slots_[i];
    if (s.filled && s.version == version && s.entries == entries) {
      s.last_use = clock_;
      previous_ = i;
      return {i, false};
    }
  }
  int victim = -1;
  for (int i = 0; i < num_slots(); ++i) {
    if (i == previous_ && num_slots() > 1) continue;
    if (victim < 0) {
      victim = i;
      continue;
    }
    const Slot& a = slots_[i];
    const Slot& b = slots_[victim];
    if ((!a.filled && b.filled) || (a.filled == b.filled && a.last_use < b.last_use)) victim = i;
  }
  Slot& s = slots_[victim];
  s.filled = true;
  s.entries = entries;
  s.version = version;
  s.last_use = clock_;
  previous_ = victim;
  return {victim, true};
}

int DistinctStageCount(const std::vector<std::vector<int>>& stage_entries) {
  return static_cast<int>(
      std::set<std::vector<int>>(stage_entries.begin(), stage_entries.end()).size());
}

}  // namespace megatrain::engine
