// GradientTurns implementation (absl::Mutex conditions; nothing spins).
#include "engine/exec/gradient_turns.h"

#include <cstdio>
#include <cstdlib>

namespace megatrain::engine {

void GradientTurns::Reset() {
  absl::MutexLock lock(&mu_);
  for (uint64_t& n : landed_) n = 0;
  aborted_ = false;
}

bool GradientTurns::WaitForTurn(int entry, uint64_t turn) {
  absl::MutexLock lock(&mu_);
  auto ready = [this, entry, turn]()
                   ABSL_SHARED_LOCKS_REQUIRED(mu_) { return aborted_ || landed_[entry] >= turn; };
  mu_.Await(absl::Condition(&ready));
  return !aborted_;
}

void GradientTurns::Landed(int entry, uint64_t turn) {
  absl::MutexLock lock(&mu_);
  if (aborted_) return;
  // Turns are taken one at a time: a second contribution landing for the same
  // turn would be a bookkeeping bug that silently reorders sums.
  if (landed_[entry] != turn) {
    std::fprintf(stderr, "GradientTurns: contribution %llu of entry %d landed out of turn (%llu)\n",
                 static_cast<unsigned long long>(turn), entry,
                 static_cast<unsigned long long>(landed_[entry]));
    std::abort();
  }
  landed_[entry] = turn + 1;
}

void GradientTurns::Abort() {
  absl::MutexLock lock(&mu_);
  aborted_ = true;
}

uint64_t GradientTurns::landed(int entry) const {
  absl::MutexLock lock(&mu_);
  return landed_[entry];
}

}  // namespace megatrain::engine
