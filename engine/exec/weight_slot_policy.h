// Which device weight slot an op's weights go to, and whether they must be
// copied: a slot is reused while it still holds the same entries at the same
// parameter version; otherwise the least recently used slot other than the
// one the previous op is still reading gets them. With two slots this is
// double buffering; with one slot per stage the weights are copied once per
// optimizer step.
#pragma once

#include <cstdint>
#include <vector>

namespace megatrain::engine {

class WeightSlotPolicy {
 public:
  explicit WeightSlotPolicy(int num_slots);

  struct Decision {
    int slot = 0;
    bool copy = false;  // the slot must be (re)filled before the op runs
  };

  Decision Place(const std::vector<int>& entries, uint64_t version);
  int num_slots() const { return static_cast<int>(slots_.size()); }

 private:
  struct Slot {
    bool filled = false;
    std::vector<int> entries;
    uint64_t version = 0;
    uint64_t last_use = 0;
  };
  std::vector<Slot> slots_;
  int previous_ = -1;
  uint64_t clock_ = 0;
};

// Number of distinct weight sets (stages) in a schedule: the slot count at
// which every stage stays resident.
int DistinctStageCount(const std::vector<std::vector<int>>& stage_entries);

}  // namespace megatrain::engine
