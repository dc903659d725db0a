// DirectFile: move-only handle to a file opened with O_DIRECT for block I/O, with its path
// (every I/O error names the file).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace megatrain::engine::tiers {

class DirectFile {
 public:
  enum class Mode {
    kOpenExisting,    // the file must exist
    kCreateOrOpen,    // created empty when missing
    kCreateTruncate,  // a new empty file: anything at the name is unlinked first, then O_EXCL
  };

  // Opens `path` read-write with O_DIRECT | O_CLOEXEC | O_NOFOLLOW: a symlink at `path` is
  // refused (PERMISSION_DENIED), so is anything but a regular file (a FIFO never blocks the
  // open). Errors name the path and the errno text;
  // EINVAL from O_DIRECT is reported as "filesystem does not support O_DIRECT".
  static absl::StatusOr<DirectFile> Open(const std::string& path, Mode mode);

  DirectFile() = default;
  DirectFile(DirectFile&& other) noexcept;
  DirectFile& operator=(DirectFile&& other) noexcept;
  DirectFile(const DirectFile&) = delete;
  DirectFile& operator=(const DirectFile&) = delete;
  ~DirectFile();  // closes, ignoring errors; call Close() to see them

  // Reserves [0, bytes) on disk (fallocate), so a full disk fails here, before the first step,
  // rather than in a write-back. Falls back to ftruncate where fallocate is unsupported.
  absl::Status Reserve(uint64_t bytes);
  absl::StatusOr<uint64_t> Size() const;
  absl::Status Sync();  // fdatasync
  absl::Status Close();

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  bool is_open() const { return fd_ >= 0; }

 private:
  DirectFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

}  // namespace megatrain::engine::tiers
