// errno mapping, write and read loops (see file_io.h).
#include "engine/common/file_io.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace megatrain::engine {

absl::Status ErrnoStatus(int err, absl::string_view context) {
  const std::string message = absl::StrCat(context, ": ", std::strerror(err), " (errno ", err, ")");
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EEXIST:
      return absl::AlreadyExistsError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(message);
    case EIO:
      return absl::DataLossError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status WriteAll(int fd, absl::Span<const uint8_t> bytes, absl::string_view path) {
  const uint8_t* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, std::min<size_t>(left, size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, absl::StrCat(path, ": write failed"));
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

namespace {

// To the end from the descriptor's offset (`pread_from` < 0) or with pread from `pread_from`.
absl::StatusOr<std::string> ReadToEnd(int fd, absl::string_view path, uint64_t max_bytes,
                                      off_t pread_from) {
  std::string out;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = pread_from < 0 ? ::read(fd, buffer, sizeof(buffer))
                                     : ::pread(fd, buffer, sizeof(buffer),
                                               pread_from + static_cast<off_t>(out.size()));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, absl::StrCat(path, ": read failed at byte ", out.size()));
    }
    if (n == 0) return out;
    if (out.size() + static_cast<uint64_t>(n) > max_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat(path, ": more than the limit of ", max_bytes, " bytes"));
    }
    out.append(buffer, static_cast<size_t>(n));
  }
}

}  // namespace

absl::StatusOr<std::string> ReadAll(int fd, absl::string_view path, uint64_t max_bytes) {
  return ReadToEnd(fd, path, max_bytes, -1);
}

absl::StatusOr<std::string> PreadAll(int fd, absl::string_view path, uint64_t max_bytes) {
  return ReadToEnd(fd, path, max_bytes, 0);
}

absl::Status PreadExactly(int fd, uint64_t offset, void* out, size_t n, absl::string_view path) {
  uint8_t* bytes = static_cast<uint8_t*>(out);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, bytes + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, absl::StrCat(path, ": read at byte ", offset + got));
    }
    if (r == 0) {
      return absl::DataLossError(absl::StrCat(path, ": ends at byte ", offset + got,
                                              ", before the ", n, " bytes at ", offset,
                                              " (truncated while being read)"));
    }
    got += static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

}  // namespace megatrain::engine
