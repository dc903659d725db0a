// UringBlockIo: BlockIo over io_uring with O_DIRECT files. A completion thread blocks in
// io_uring_wait_cqe (nothing spins), finishes short transfers, retries -EAGAIN and tops the ring
// up from a FIFO of waiting requests.
#pragma once

#include <deque>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/tiers/block_io.h"
#include "engine/tiers/uring_ring.h"

namespace megatrain::engine::tiers {

// Defaults measured with bench/nvme (docs/operations.md, "Queue depth and block size").
inline constexpr int kDefaultQueueDepth = 8;
inline constexpr size_t kDefaultBlockBytes = size_t{2} << 20;

struct UringOptions {
  int queue_depth = kDefaultQueueDepth;  // requests in the kernel at once, 1..4096
};

class UringBlockIo final : public BlockIo {
 public:
  // A -EAGAIN is resubmitted at most this many times before the request fails.
  static constexpr int kMaxAgainRetries = 1000;

  static absl::StatusOr<std::unique_ptr<UringBlockIo>> Create(const UringOptions& options = {});
  ~UringBlockIo() override;  // waits for every submitted request, then stops the thread

  IoFuture Submit(const IoRequest& request) override;
  int queue_depth() const override { return queue_depth_; }

 private:
  struct Op {
    IoRequest request;
    uint64_t done_bytes = 0;
    int again_retries = 0;
    std::shared_ptr<IoCompletion> completion;
  };
  UringBlockIo(UringRing ring, int queue_depth);
  void CompletionLoop();
  // Puts the not-yet-transferred remainder of `op` into the ring and submits it. An error (the
  // kernel refused the submission past the retries) names the op's file and offset; the op is
  // then not in the ring.
  absl::Status SubmitToRingLocked(Op* op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A free submission entry, submitting what is queued first if there is none.
  io_uring_sqe* GetSqeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillRingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Handles one completion; returns true when the op is finished (its result is in *status).
  bool HandleResult(Op* op, int res, absl::Status* status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  UringRing ring_;
  const int queue_depth_;
  absl::Mutex mu_;
  std::deque<Op*> waiting_ ABSL_GUARDED_BY(mu_);
  int in_ring_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread completion_thread_;
};

}  // namespace megatrain::engine::tiers
