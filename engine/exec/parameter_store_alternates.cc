// ParameterStore's alternate master, m and v in RAM: the speculative update of a state in RAM
// writes them out of place during the backward, and a commit swaps them with the current ones.
// With m and v on NVMe (the mixed form) only the master has an alternate array here; m's and v's
// are the state file's alternate regions.
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/exec/parameter_store.h"

namespace megatrain::engine {

absl::Status ParameterStore::AllocateAlternates(Device& device) {
  for (size_t e = 0; e < specs_.size(); ++e) {
    const size_t n = specs_[e].elements;
    struct Wanted {
      std::vector<HostArray>* list;
      const HostArray& current;  // the alternate takes the current array's tier
      const char* kind;
    };
    std::vector<Wanted> wanted = {{&alt_master_, master_[e], "alternate master"}};
    // With m and v on NVMe (the mixed form) their alternates are regions of the state file.
    if (!m_.empty()) {
      wanted.push_back({&alt_m_, m_[e], "alternate adam_m"});
      wanted.push_back({&alt_v_, v_[e], "alternate adam_v"});
    }
    for (const Wanted& w : wanted) {
      absl::StatusOr<HostArray> array = AllocateArray(device, n, !w.current.pinned.empty());
      if (!array.ok()) {
        return absl::Status(array.status().code(), absl::StrCat("parameter entry ", e, " ", w.kind,
                                                                ": ", array.status().message()));
      }
      w.list->push_back(std::move(*array));
    }
  }
  return absl::OkStatus();
}

EntryBuffers ParameterStore::alternate(int e) const {
  EntryBuffers b;
  if (alt_master_.empty()) return b;
  b.master = alt_master_[e].data();
  if (!alt_m_.empty()) {
    b.m = alt_m_[e].data();
    b.v = alt_v_[e].data();
  }
  b.elements = specs_[e].elements;
  return b;
}

void ParameterStore::SwapAlternateState(int e) {
  if (alt_master_.empty()) return;
  std::swap(master_[e], alt_master_[e]);
  if (alt_m_.empty()) return;  // m and v on NVMe: the state file's parity flip commits them
  std::swap(m_[e], alt_m_[e]);
  std::swap(v_[e], alt_v_[e]);
}

absl::Status ParameterStore::RestoreComputeCopyFromRamMaster(int e) {
  if (master_.empty()) return absl::OkStatus();  // on NVMe: RestoreComputeCopyFromNvmeMaster
  return WriteComputeCopy(e, master_[e].data());
}

}  // namespace megatrain::engine
