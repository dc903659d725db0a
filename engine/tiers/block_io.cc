// BlockIo: request validation and the completion handle.
#include "engine/tiers/block_io.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "engine/tiers/aligned_buffer.h"

namespace megatrain::engine::tiers {

absl::Status ValidateRequest(const IoRequest& request) {
  if (request.file == nullptr || !request.file->is_open()) {
    return absl::InvalidArgumentError("I/O request has no open file");
  }
  const auto misaligned = [&](const char* field, uint64_t value) {
    return absl::InvalidArgumentError(absl::StrCat("I/O request on ", request.file->path(), ": ",
                                                   field, "=", value, " is not a multiple of ",
                                                   kDirectIoAlignment, " (O_DIRECT)"));
  };
  if (request.offset % kDirectIoAlignment != 0) return misaligned("offset", request.offset);
  if (request.bytes % kDirectIoAlignment != 0 || request.bytes == 0) {
    return misaligned("bytes", request.bytes);
  }
  const auto address = reinterpret_cast<uintptr_t>(request.data);
  if (address % kDirectIoAlignment != 0 || address == 0) return misaligned("data", address);
  return absl::OkStatus();
}

void IoCompletion::Complete(absl::Status status) {
  absl::MutexLock lock(&mu_);
  status_ = std::move(status);
  done_ = true;
}

absl::Status IoCompletion::Wait(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithTimeout(absl::Condition(&done_), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("I/O request did not complete within ", absl::FormatDuration(timeout)));
  }
  return status_;
}

bool IoCompletion::done() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

IoFuture IoFuture::Ready(absl::Status status) {
  auto completion = std::make_shared<IoCompletion>();
  completion->Complete(std::move(status));
  return IoFuture(std::move(completion));
}

absl::Status IoFuture::Wait(absl::Duration timeout) const {
  if (completion_ == nullptr) return absl::FailedPreconditionError("waiting on an empty IoFuture");
  return completion_->Wait(timeout);
}

}  // namespace megatrain::engine::tiers
