// UringBlockIo: submission, completion, short-transfer and -EAGAIN handling.
#include "engine/tiers/uring_block_io.h"

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
    io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
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
    SubmitToRingLocked(op);
  }
}

void UringBlockIo::SubmitToRingLocked(Op* op) {
  io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
  // At most queue_depth ops are in the ring and each holds one sqe at a time.
  if (sqe == nullptr) std::abort();
  const IoRequest& r = op->request;
  char* data = static_cast<char*>(r.data) + op->done_bytes;
  const unsigned remaining = static_cast<unsigned>(r.bytes - op->done_bytes);
  const uint64_t offset = r.offset + op->done_bytes;
  if (r.op == IoOp::kRead) {
    io_uring_prep_read(sqe, r.file->fd(), data, remaining, offset);
  } else {
    io_uring_prep_write(sqe, r.file->fd(), data, remaining, offset);
  }
  io_uring_sqe_set_data(sqe, op);
  const int rc = io_uring_submit(ring_.get());
  // Submission fails only on programmer errors (bad ring state) or -EBUSY with a full CQ, which
  // cannot happen: the CQ holds twice as many entries as can be in flight.
  if (rc < 0) {
    std::fprintf(stderr, "io_uring_submit failed: %s\n", std::strerror(-rc));
    std::abort();
  }
}

bool UringBlockIo::HandleResult(Op* op, int res, absl::Status* status) {
  const IoRequest& r = op->request;
  const uint64_t offset = r.offset + op->done_bytes;
  const uint64_t remaining = r.bytes - op->done_bytes;
  if (res == -EAGAIN || res == -EINTR) {
    if (++op->again_retries <= kMaxAgainRetries) {
      SubmitToRingLocked(op);
      return false;
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
    SubmitToRingLocked(op);
    return false;
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
