// Status values for I/O failures: errno mapped onto absl codes, with the file and offset named,
// shared by the io_uring implementation and the fault-injecting fake so both say the same thing.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "engine/common/file_io.h"

namespace megatrain::engine::tiers {

enum class IoOp { kRead, kWrite };

// The plain errno mapping is engine::ErrnoStatus (engine/common/file_io.h).
// "<read|write> of N bytes at offset X of <path> failed: ..." (ENOSPC adds "disk full").
absl::Status IoErrnoStatus(IoOp op, int err, const std::string& path, uint64_t offset,
                           uint64_t bytes);

// A read that hit end of file before `expected` bytes: the file is truncated.
absl::Status TruncatedReadStatus(const std::string& path, uint64_t offset, uint64_t got,
                                 uint64_t expected);

}  // namespace megatrain::engine::tiers
