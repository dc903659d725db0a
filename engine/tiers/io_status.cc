// Status values for I/O failures.
#include "engine/tiers/io_status.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace megatrain::engine::tiers {

absl::Status IoErrnoStatus(IoOp op, int err, const std::string& path, uint64_t offset,
                           uint64_t bytes) {
  return ErrnoStatus(
      err, absl::StrCat(op == IoOp::kRead ? "read" : "write", " of ", bytes, " bytes at offset ",
                        offset, " of ", path, " failed", err == ENOSPC ? " (disk full)" : ""));
}

absl::Status TruncatedReadStatus(const std::string& path, uint64_t offset, uint64_t got,
                                 uint64_t expected) {
  return absl::DataLossError(absl::StrCat("state file ", path, " is truncated: read at offset ",
                                          offset, " returned ", got, " of ", expected,
                                          " bytes (end of file)"));
}

}  // namespace megatrain::engine::tiers
