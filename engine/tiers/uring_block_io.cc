// UringBlockIo: submission, completion, short-transfer and -EAGAIN handling.
#include "engine/tiers/uring_block_io.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace megatrain::engine::tiers {
namespace {
// user_data of the NOP that tells the completion thread to stop; ops carry their address.
constexpr uint64_t kStopToken = 0;
// user_data of an entry turned into a NOP after its submission failed: its completion is ignored.
constexpr uint64_t kIgnoredToken = 1;
// The most bytes one read or write asks for (its length field is 32 bits); a larger request
// goes in pieces through the short-transfer path.
constexpr uint64_t kMaxTransferBytes = uint64_t{1} << 30;
}  // namespace

absl::StatusOr<std::unique_ptr<UringBlockIo>> UringBlockIo::Create(const UringOptions& options) {
  if (options.queue_depth < 1 || options.queue_depth > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("queue_depth=", options.queue_depth, " must be in [1, 4096]"));
  }
  absl::StatusOr<UringRing> ring = UringRing::Create(static_cast<unsigned>(options.queue_depth));
  if (!ring.ok()) return ring.status();
  return std::unique_ptr<UringBlockIo>(new UringBlockIo(*std::move(ring), options.queue_depth));
}

UringBlockIo::UringBlockIo(UringRing ring, int queue_depth)
    : ring_(std::move(ring)), queue_depth_(queue_depth) {
  completion_thread_ = std::thread([this] { CompletionLoop(); });
}

UringBlockIo::~UringBlockIo() {
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](UringBlockIo* self) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return self->in_ring_ == 0 && self->waiting_.empty();
        },
        this));
    // The ring is empty, so a slot is free.
    io_uring_sqe* sqe = GetSqeLocked();
    if (sqe == nullptr) std::abort();  // an empty ring of queue_depth >= 1 entries has one
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data64(sqe, kStopToken);
    io_uring_submit(ring_.get());
  }
  completion_thread_.join();
}

IoFuture UringBlockIo::Submit(const IoRequest& request) {
  if (absl::Status valid = ValidateRequest(request); !valid.ok()) return IoFuture::Ready(valid);
  auto* op = new Op{request, 0, 0, std::make_shared<IoCompletion>()};
  IoFuture future(op->completion);
  absl::MutexLock lock(&mu_);
  waiting_.push_back(op);
  FillRingLocked();
  return future;
}

void UringBlockIo::FillRingLocked() {
  while (in_ring_ < queue_depth_ && !waiting_.empty()) {
    Op* op = waiting_.front();
    waiting_.pop_front();
    ++in_ring_;
    if (absl::Status s = SubmitToRingLocked(op); !s.ok()) {
      --in_ring_;
      op->completion->Complete(std::move(s));  // takes only the completion's own lock
      delete op;
    }
  }
}

io_uring_sqe* UringBlockIo::GetSqeLocked() {
  io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
  if (sqe != nullptr) return sqe;
  // At most queue_depth ops are in the ring and each holds one entry at a time; an entry left
  // unsubmitted by a failed submission (a NOP by then) may hold the last one.
  (void)io_uring_submit(ring_.get());
  return io_uring_get_sqe(ring_.get());
}

absl::Status UringBlockIo::SubmitToRingLocked(Op* op) {
  const IoRequest& r = op->request;
  const uint64_t offset = r.offset + op->done_bytes;
  const uint64_t left = r.bytes - op->done_bytes;
  io_uring_sqe* sqe = GetSqeLocked();
  if (sqe == nullptr) {
    return IoErrnoStatus(r.op, EBUSY, r.file->path(), offset, left);
  }
  char* data = static_cast<char*>(r.data) + op->done_bytes;
  const unsigned length = static_cast<unsigned>(std::min(left, kMaxTransferBytes));
  if (r.op == IoOp::kRead) {
    io_uring_prep_read(sqe, r.file->fd(), data, length, offset);
  } else {
    io_uring_prep_write(sqe, r.file->fd(), data, length, offset);
  }
  io_uring_sqe_set_data(sqe, op);
  // The CQ holds twice as many entries as can be in flight, so -EBUSY should not happen; the
  // kernel may still be short of memory for a moment (-EAGAIN) or the call interrupted.
  // A submission may take only the earlier entries (ignored NOPs of earlier failures, in queue
  // order): this one is in only when nothing is left queued.
  int rc = 0;
  for (int tries = 0;; ++tries) {
    rc = io_uring_submit(ring_.get());
    const bool retry = rc == -EINTR || rc == -EAGAIN || rc == -EBUSY ||
                       (rc >= 0 && io_uring_sq_ready(ring_.get()) > 0);
    if (!retry || tries >= kMaxAgainRetries) break;
  }
  if (rc >= 0 && io_uring_sq_ready(ring_.get()) > 0) rc = -EAGAIN;  // still queued: not in
  if (rc < 0) {
    // The entry stays in the submission queue: as a NOP whose completion is ignored, it can no
    // longer reach this op, which ends here with the error.
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data64(sqe, kIgnoredToken);
    return IoErrnoStatus(r.op, -rc, r.file->path(), offset, left);
  }
  return absl::OkStatus();
}

bool UringBlockIo::HandleResult(Op* op, int res, absl::Status* status) {
  const IoRequest& r = op->request;
  const uint64_t offset = r.offset + op->done_bytes;
  const uint64_t remaining = r.bytes - op->done_bytes;
  if (res == -EAGAIN || res == -EINTR) {
    if (++op->again_retries <= kMaxAgainRetries) {
      *status = SubmitToRingLocked(op);
      return !status->ok();
    }
    *status = IoErrnoStatus(r.op, -res, r.file->path(), offset, remaining);
    return true;
  }
  if (res < 0) {
    *status = IoErrnoStatus(r.op, -res, r.file->path(), offset, remaining);
    return true;
  }
  if (res == 0) {
    *status = r.op == IoOp::kRead
                  ? TruncatedReadStatus(r.file->path(), r.offset, op->done_bytes, r.bytes)
                  : IoErrnoStatus(r.op, EIO, r.file->path(), offset, remaining);
    return true;
  }
  op->done_bytes += static_cast<uint64_t>(res);
  if (op->done_bytes < r.bytes) {  // short transfer: the rest goes back into the ring
    *status = SubmitToRingLocked(op);
    return !status->ok();
  }
  *status = absl::OkStatus();
  return true;
}

void UringBlockIo::CompletionLoop() {
  for (;;) {
    io_uring_cqe* cqe = nullptr;
    const int rc = io_uring_wait_cqe(ring_.get(), &cqe);
    if (rc == -EINTR || rc == -EAGAIN) continue;
    if (rc < 0) {
      std::fprintf(stderr, "io_uring_wait_cqe failed: %s\n", std::strerror(-rc));
      std::abort();
    }
    const uint64_t token = io_uring_cqe_get_data64(cqe);
    const int res = cqe->res;
    io_uring_cqe_seen(ring_.get(), cqe);
    if (token == kStopToken) return;
    if (token == kIgnoredToken) continue;
    auto* op = reinterpret_cast<Op*>(token);
    absl::Status status;
    bool finished;
    {
      absl::MutexLock lock(&mu_);
      finished = HandleResult(op, res, &status);
      if (finished) {
        --in_ring_;
        FillRingLocked();
      }
    }
    if (finished) {
      op->completion->Complete(std::move(status));
      delete op;
    }
  }
}

}  // namespace megatrain::engine::tiers
