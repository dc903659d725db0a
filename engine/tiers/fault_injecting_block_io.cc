// FaultInjectingBlockIo: the fault schedule.
#include "engine/tiers/fault_injecting_block_io.h"

#include <cerrno>

namespace megatrain::engine::tiers {

void FaultInjectingBlockIo::FailNth(uint64_t nth, InjectedFault fault) {
  absl::MutexLock lock(&mu_);
  counted_ = 0;
  nth_ = nth;
  filter_by_op_ = false;
  range_begin_ = 0;
  range_end_ = UINT64_MAX;
  only_path_.clear();
  fault_ = fault;
}

void FaultInjectingBlockIo::FailNthOf(IoOp only, uint64_t nth, InjectedFault fault) {
  FailNthOfRange(only, 0, UINT64_MAX, nth, fault);
}

void FaultInjectingBlockIo::FailNthOfRange(IoOp only, uint64_t begin, uint64_t end, uint64_t nth,
                                           InjectedFault fault) {
  absl::MutexLock lock(&mu_);
  counted_ = 0;
  nth_ = nth;
  filter_by_op_ = true;
  only_ = only;
  range_begin_ = begin;
  range_end_ = end;
  only_path_.clear();
  fault_ = fault;
}

void FaultInjectingBlockIo::FailNthOfFile(IoOp only, const std::string& path, uint64_t nth,
                                          InjectedFault fault) {
  FailNthOf(only, nth, fault);
  absl::MutexLock lock(&mu_);
  only_path_ = path;
}

uint64_t FaultInjectingBlockIo::requests_seen() const {
  absl::MutexLock lock(&mu_);
  return seen_;
}

IoFuture FaultInjectingBlockIo::Submit(const IoRequest& request) {
  if (absl::Status valid = ValidateRequest(request); !valid.ok()) return IoFuture::Ready(valid);
  InjectedFault fault = InjectedFault::kNone;
  {
    absl::MutexLock lock(&mu_);
    ++seen_;
    const bool in_range =
        request.offset < range_end_ && request.offset + request.bytes > range_begin_ &&
        (only_path_.empty() || request.file->path() == only_path_);
    if (fault_ != InjectedFault::kNone && (!filter_by_op_ || request.op == only_) && in_range &&
        ++counted_ == nth_) {
      fault = fault_;
      fault_ = InjectedFault::kNone;
    }
  }
  const std::string& path = request.file->path();
  switch (fault) {
    case InjectedFault::kNone:
      return inner_.Submit(request);
    case InjectedFault::kEio:
      return IoFuture::Ready(IoErrnoStatus(request.op, EIO, path, request.offset, request.bytes));
    case InjectedFault::kEnospc:
      return IoFuture::Ready(
          IoErrnoStatus(request.op, ENOSPC, path, request.offset, request.bytes));
    case InjectedFault::kTruncate:
      return IoFuture::Ready(
          request.op == IoOp::kRead
              ? TruncatedReadStatus(path, request.offset, 0, request.bytes)
              : IoErrnoStatus(request.op, EIO, path, request.offset, request.bytes));
  }
  return inner_.Submit(request);
}

}  // namespace megatrain::engine::tiers
