// SpeculativeUpdate: a queue of entries with final gradients and the thread that updates them.
#include "engine/train/speculative_update.h"

#include <utility>

namespace megatrain::engine {

void SpeculativeUpdate::Begin(std::function<void()> prepare,
                              std::function<absl::StatusOr<bool>(int entry)> update) {
  (void)Finish();
  {
    absl::MutexLock lock(&mu_);
    queue_.clear();
    closing_ = false;
  }
  outcome_ = Outcome{};
  outcome_.updated.assign(static_cast<size_t>(num_entries_), false);
  thread_ = std::thread([this, prepare = std::move(prepare), update = std::move(update)] {
    Run(prepare, update);
  });
}

void SpeculativeUpdate::EntryFinal(int entry) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(entry);
}

void SpeculativeUpdate::Run(std::function<void()> prepare,
                            std::function<absl::StatusOr<bool>(int)> update) {
  prepare();
  while (true) {
    int entry = -1;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || closing_;
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // closing and drained
      entry = queue_.front();
      queue_.pop_front();
    }
    // After an error or a stop the rest is only drained: the step fails with the first error,
    // or the speculation is discarded.
    if (!outcome_.status.ok() || outcome_.stopped) continue;
    absl::StatusOr<bool> updated = update(entry);
    if (!updated.ok()) {
      outcome_.status = updated.status();
    } else if (!*updated) {
      outcome_.stopped = true;
    } else {
      outcome_.updated[entry] = true;
      ++outcome_.count;
    }
  }
}

SpeculativeUpdate::Outcome SpeculativeUpdate::Finish() {
  if (!thread_.joinable()) return Outcome{};
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
  }
  thread_.join();
  return std::move(outcome_);
}

}  // namespace megatrain::engine
