// SpeculativeUpdate: the thread of the trainer's speculative optimizer update. During the last
// micro-batch's backward the executor reports each entry whose gradient is final; this thread
// updates those entries (AdamW with clip coefficient 1, into the NVMe state file's alternate
// regions), so the optimizer's NVMe traffic overlaps the backward instead of the next forward.
// The trainer commits the result when the step's real clip coefficient is exactly 1 and
// discards it otherwise (docs/operations.md, "Speculative update").
//
// Protocol, per step: Begin(prepare, update), then EntryFinal(e) from any thread (the executor's
// copy_out host tasks; it never blocks), then Finish() once no EntryFinal can follow. The thread
// runs `prepare` once (it waits until the store is the thread's alone), then update(e) for each
// entry in the order they were reported. update(e) returns whether it updated e; false means the
// speculation cannot be committed any more (the trainer saw the clip coefficient fall below 1),
// so the rest is not updated. The first error stops it too; Finish returns it.
#pragma once

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace megatrain::engine {

class SpeculativeUpdate {
 public:
  struct Outcome {
    std::vector<bool> updated;  // per entry: written whole to the alternate regions
    int count = 0;              // entries updated
    bool stopped = false;       // update returned false: the rest was left alone
    absl::Status status;        // the first error (an NVMe read or write, naming file and offset)
  };

  explicit SpeculativeUpdate(int num_entries) : num_entries_(num_entries) {}
  ~SpeculativeUpdate() { (void)Finish(); }
  SpeculativeUpdate(const SpeculativeUpdate&) = delete;
  SpeculativeUpdate& operator=(const SpeculativeUpdate&) = delete;

  void Begin(std::function<void()> prepare, std::function<absl::StatusOr<bool>(int entry)> update);
  void EntryFinal(int entry);
  // Waits for every reported entry's update (or the first error). Idempotent: without a Begin
  // since the last Finish it returns an empty outcome.
  Outcome Finish();
  bool running() const { return thread_.joinable(); }

 private:
  void Run(std::function<void()> prepare, std::function<absl::StatusOr<bool>(int)> update);

  const int num_entries_;
  std::thread thread_;
  absl::Mutex mu_;
  std::deque<int> queue_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  Outcome outcome_;  // written by the thread, read after joining it
};

}  // namespace megatrain::engine
