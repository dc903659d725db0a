// FaultInjectingBlockIo: a BlockIo decorator for tests that fails the Nth request with EIO,
// ENOSPC or a truncated read, passing every other request to the real implementation.
#pragma once

#include <cstdint>
#include <string>

#include "absl/synchronization/mutex.h"
#include "engine/tiers/block_io.h"

namespace megatrain::engine::tiers {

enum class InjectedFault {
  kNone,
  kEio,       // the request fails with EIO
  kEnospc,    // the request fails with ENOSPC (disk full)
  kTruncate,  // a read finds end of file (0 bytes); a write fails with EIO
};

class FaultInjectingBlockIo final : public BlockIo {
 public:
  explicit FaultInjectingBlockIo(BlockIo& inner) : inner_(inner) {}

  // Fails the `nth` request (1-based, counted over the requests Submit sees from now on, of kind
  // `only` when set) with `fault`; later requests pass through again.
  void FailNth(uint64_t nth, InjectedFault fault);
  void FailNthOf(IoOp only, uint64_t nth, InjectedFault fault);
  // As FailNthOf, counting only requests whose bytes overlap [begin, end) of the file (one array
  // of a state file, say).
  void FailNthOfRange(IoOp only, uint64_t begin, uint64_t end, uint64_t nth, InjectedFault fault);

  // As FailNthOf, counting only requests on the file at `path` (the gradient file, say).
  void FailNthOfFile(IoOp only, const std::string& path, uint64_t nth, InjectedFault fault);

  IoFuture Submit(const IoRequest& request) override;
  int queue_depth() const override { return inner_.queue_depth(); }
  uint64_t requests_seen() const;

 private:
  BlockIo& inner_;
  mutable absl::Mutex mu_;
  uint64_t seen_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t counted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t nth_ ABSL_GUARDED_BY(mu_) = 0;
  bool filter_by_op_ ABSL_GUARDED_BY(mu_) = false;
  IoOp only_ ABSL_GUARDED_BY(mu_) = IoOp::kRead;
  uint64_t range_begin_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t range_end_ ABSL_GUARDED_BY(mu_) = UINT64_MAX;
  std::string only_path_ ABSL_GUARDED_BY(mu_);  // empty = any file
  InjectedFault fault_ ABSL_GUARDED_BY(mu_) = InjectedFault::kNone;
};

}  // namespace megatrain::engine::tiers
