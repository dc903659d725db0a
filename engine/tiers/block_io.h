// BlockIo: the asynchronous block I/O interface the NVMe tier runs on (submit an aligned read or
// write at an offset, wait on a future-like handle), implemented by io_uring and by a
// fault-injecting fake.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/tiers/direct_file.h"
#include "engine/tiers/io_status.h"

namespace megatrain::engine::tiers {

// offset, data and bytes must be multiples of kDirectIoAlignment (O_DIRECT). The file and the
// memory stay alive and untouched until the request completes.
struct IoRequest {
  IoOp op = IoOp::kRead;
  const DirectFile* file = nullptr;
  uint64_t offset = 0;
  void* data = nullptr;
  size_t bytes = 0;
};

// INVALID_ARGUMENT naming the misaligned field and its value, or the missing file.
absl::Status ValidateRequest(const IoRequest& request);

// The completion side of a request; implementations complete each exactly once.
class IoCompletion {
 public:
  void Complete(absl::Status status);
  absl::Status Wait(absl::Duration timeout);
  bool done() const;

 private:
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// Future-like handle on one request. Copyable (shares the completion); default = invalid.
class IoFuture {
 public:
  IoFuture() = default;
  explicit IoFuture(std::shared_ptr<IoCompletion> completion)
      : completion_(std::move(completion)) {}
  static IoFuture Ready(absl::Status status);

  // The request's result: OK when every byte moved, else an error naming file and offset.
  // DEADLINE_EXCEEDED if `timeout` passes first (the request is still in flight).
  absl::Status Wait(absl::Duration timeout = absl::InfiniteDuration()) const;
  bool ready() const { return completion_ == nullptr || completion_->done(); }
  bool valid() const { return completion_ != nullptr; }

 private:
  std::shared_ptr<IoCompletion> completion_;
};

class BlockIo {
 public:
  virtual ~BlockIo() = default;
  // Never blocks on the I/O itself: requests beyond queue_depth() wait in FIFO order inside the
  // implementation. Thread-safe.
  virtual IoFuture Submit(const IoRequest& request) = 0;
  // Requests the implementation keeps in flight at once.
  virtual int queue_depth() const = 0;
};

}  // namespace megatrain::engine::tiers
