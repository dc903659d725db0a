// File I/O helpers every room shares: the one errno-to-Status mapping, a write loop that
// finishes short writes, and a bounded read of an open descriptor to its end. Whole files by
// path are read with ReadRegularFile (safe_files.h), which uses ReadAll.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace megatrain::engine {

// "<context>: <strerror> (errno N)" with the code a caller can act on: NOT_FOUND (ENOENT,
// ENOTDIR), ALREADY_EXISTS (EEXIST), PERMISSION_DENIED (EACCES, EPERM), RESOURCE_EXHAUSTED
// (ENOSPC, EDQUOT), DATA_LOSS (EIO), INTERNAL otherwise.
absl::Status ErrnoStatus(int err, absl::string_view context);

// Writes every byte (retrying EINTR and short writes); errors name `path`.
absl::Status WriteAll(int fd, absl::Span<const uint8_t> bytes, absl::string_view path);
inline absl::Status WriteAll(int fd, std::string_view bytes, absl::string_view path) {
  return WriteAll(
      fd, absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), path);
}

// Reads `fd` from its current offset to the end; RESOURCE_EXHAUSTED (naming `path`) once more
// than `max_bytes` arrive, so a file that grows while read stays bounded.
absl::StatusOr<std::string> ReadAll(int fd, absl::string_view path, uint64_t max_bytes);
// The same from offset 0 with pread: the descriptor's offset is neither used nor moved, so
// several readers of one descriptor do not disturb each other.
absl::StatusOr<std::string> PreadAll(int fd, absl::string_view path, uint64_t max_bytes);
// Exactly `n` bytes at `offset` (pread, retrying EINTR and short reads); DATA_LOSS naming `path`
// and the offsets when the file ends first (it was truncated after it was checked).
absl::Status PreadExactly(int fd, uint64_t offset, void* out, size_t n, absl::string_view path);

}  // namespace megatrain::engine
