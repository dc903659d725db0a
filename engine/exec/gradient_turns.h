// GradientTurns: the order in which several executors' gradient contributions
// land in the host slabs of one step (several devices in one process,
// docs/scale_out.md "Several devices in one process").
//
// Every entry's slab must receive its contributions in global micro-batch
// order, exactly as one device with accumulation A adds them (the first
// overwrites, later ones are added in order; a tied embedding gets the LM
// head's dense gradient, then the rows' scatter, per micro-batch). Per entry a
// counter of landed contributions: contribution k of micro-batch m into entry
// e is turn m * C_e + k (C_e contributions per micro-batch). Its copy-out
// waits, as a host task on the executor's copy_out stream, until the counter
// reaches its turn, and advances the counter once its own copy has landed
// (stream order makes "after" correct for asynchronous copies). A device only
// ever waits for earlier micro-batches, which never wait for it: no deadlock.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace megatrain::engine {

class GradientTurns {
 public:
  explicit GradientTurns(int num_entries) : landed_(static_cast<size_t>(num_entries), 0) {}
  GradientTurns(const GradientTurns&) = delete;
  GradientTurns& operator=(const GradientTurns&) = delete;

  // Start of a step: no contribution has landed, and a previous abort is forgotten.
  void Reset();
  // Blocks until `turn` contributions of entry have landed, or until Abort.
  // Returns false when aborted (the step fails; what lands then is discarded).
  bool WaitForTurn(int entry, uint64_t turn);
  // Contribution `turn` of entry has landed: the next one may go.
  void Landed(int entry, uint64_t turn);
  // A micro-batch failed: every waiter returns at once (its step fails too).
  void Abort();
  uint64_t landed(int entry) const;

 private:
  mutable absl::Mutex mu_;
  std::vector<uint64_t> landed_ ABSL_GUARDED_BY(mu_);
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
};

// What an executor needs to take its turns in one micro-batch: the shared
// gate and the micro-batch's index in the step (its global order).
struct MicroBatchTurns {
  GradientTurns* turns = nullptr;  // null: one device, stream order alone suffices
  int micro_batch = 0;
  // The device's first micro-batch of the step: with a DeviceReduction it starts the device's
  // sums (whatever an earlier, failed step left pending).
  bool first_on_device = true;
};

}  // namespace megatrain::engine
