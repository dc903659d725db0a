// UpdateGate implementation (absl::Mutex conditions; nothing spins).
#include "engine/exec/update_gate.h"

namespace megatrain::engine {

void UpdateGate::WaitFor(int entry, uint64_t version) {
  absl::MutexLock lock(&mu_);
  auto ready = [this, entry, version]()
                   ABSL_SHARED_LOCKS_REQUIRED(mu_) { return versions_[entry] >= version; };
  mu_.Await(absl::Condition(&ready));
}

void UpdateGate::Publish(int entry, uint64_t version) {
  absl::MutexLock lock(&mu_);
  versions_[entry] = version;
}

uint64_t UpdateGate::version(int entry) const {
  absl::MutexLock lock(&mu_);
  return versions_[entry];
}

void UpdateGate::ResetAll(uint64_t version) {
  absl::MutexLock lock(&mu_);
  for (auto& v : versions_) v = version;
}

}  // namespace megatrain::engine
