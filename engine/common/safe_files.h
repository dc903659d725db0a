// Safe file opening for a daemon that reads users' inputs and writes into directories other
// users can write to: inputs must be regular files (a FIFO, device or socket is refused without
// blocking), and written files never follow a planted symlink (created with O_EXCL|O_NOFOLLOW
// relative to an open directory, then renamed into place).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/common/unique_fd.h"

namespace megatrain::engine {

// "a FIFO", "a character device", "a block device", "a socket", "a directory", "a symlink",
// "a regular file" for a st_mode.
const char* FileTypeName(mode_t mode);

// Opens `path` read-only (O_NONBLOCK while opening, so a FIFO never blocks; cleared after) and
// checks the opened descriptor with fstat: anything but a regular file is INVALID_ARGUMENT
// "<path> is a FIFO, not a regular file". NOT_FOUND / PERMISSION_DENIED name the path.
absl::StatusOr<UniqueFd> OpenRegularFileForRead(const std::string& path);

// The whole content of a regular file opened as above; RESOURCE_EXHAUSTED past `max_bytes`.
absl::StatusOr<std::string> ReadRegularFile(const std::string& path,
                                            uint64_t max_bytes = uint64_t{1} << 40);

// Opens a directory (O_DIRECTORY; the path's own symlinks are resolved as usual).
absl::StatusOr<UniqueFd> OpenDirectory(const std::string& dir);

// Writes `contents` to <dir>/<name> atomically: a new file `.<name>.<random>.tmp` created with
// O_CREAT|O_EXCL|O_NOFOLLOW relative to the directory's descriptor, fsynced, then renamed over
// <name> (rename replaces a planted symlink itself, never what it points to). `name` must be a
// single path component.
absl::Status WriteFileInDirectory(const std::string& dir, const std::string& name,
                                  std::string_view contents, mode_t mode = 0640);

// The same atomic write for content produced piece by piece (a token file larger than memory):
// Create makes the temporary file as above, Append writes through a buffer, Commit fsyncs and
// renames it over <dir>/<name>. Destroyed before Commit (or after a failed Append), the
// temporary file is removed and <name> is untouched. Move-only.
class FileInDirectoryWriter {
 public:
  static absl::StatusOr<FileInDirectoryWriter> Create(const std::string& dir,
                                                      const std::string& name,
                                                      mode_t mode = 0640);
  FileInDirectoryWriter(FileInDirectoryWriter&& other) noexcept;
  FileInDirectoryWriter& operator=(FileInDirectoryWriter&& other) noexcept;
  FileInDirectoryWriter(const FileInDirectoryWriter&) = delete;
  FileInDirectoryWriter& operator=(const FileInDirectoryWriter&) = delete;
  ~FileInDirectoryWriter();

  absl::Status Append(std::string_view bytes);
  absl::Status Commit();
  uint64_t bytes_written() const { return written_ + buffer_.size(); }

 private:
  FileInDirectoryWriter() = default;
  absl::Status Flush();
  void Discard();

  std::string dir_, name_, tmp_;
  UniqueFd dir_fd_, fd_;
  std::string buffer_;
  uint64_t written_ = 0;
};

// mkdir -p with `mode` (default 0750) for every directory it creates; existing ones are kept.
// Fails when a component exists and is not a directory.
absl::Status MakeDirectories(const std::string& path, mode_t mode = 0750);

}  // namespace megatrain::engine
