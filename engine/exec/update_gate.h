// Per-entry version counters that let the next step's weight prefetch start as
// soon as that entry's optimizer update is done, while later entries are still
// being updated (the optimizer/forward overlap of DESIGN.md, step 4).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace megatrain::engine {

class UpdateGate {
 public:
  explicit UpdateGate(int num_entries) : versions_(num_entries, 0) {}

  // Blocks until entry's version is at least `version`.
  void WaitFor(int entry, uint64_t version);
  // Publishes that entry now holds parameters of `version`.
  void Publish(int entry, uint64_t version);
  uint64_t version(int entry) const;
  // Sets every entry to `version` (start of training or resume).
  void ResetAll(uint64_t version);

 private:
  mutable absl::Mutex mu_;
  std::vector<uint64_t> versions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace megatrain::engine
