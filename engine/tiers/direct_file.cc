// DirectFile: open/reserve/close with errors naming the path.
#include "engine/tiers/direct_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/tiers/io_status.h"

namespace megatrain::engine::tiers {

absl::StatusOr<DirectFile> DirectFile::Open(const std::string& path, Mode mode) {
  // Never through a symlink, never onto a FIFO or device: the directory may be writable by
  // others (docs/daemon.md, "Hardening").
  int flags = O_RDWR | O_DIRECT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;
  if (mode == Mode::kCreateOrOpen) flags |= O_CREAT;
  // A truncating create always makes a new inode: whatever was at the name is unlinked first
  // (a planted symlink or hard link is removed, never written through), then O_EXCL.
  if (mode == Mode::kCreateTruncate) flags |= O_CREAT | O_EXCL;
  int fd = ::open(path.c_str(), flags, 0600);
  if (fd < 0 && errno == EEXIST && mode == Mode::kCreateTruncate) {
    if (::unlink(path.c_str()) == 0 || errno == ENOENT) fd = ::open(path.c_str(), flags, 0600);
  }
  if (fd < 0) {
    const int err = errno;
    if (err == EINVAL) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot open ", path,
                       " with O_DIRECT: the filesystem does not support direct I/O "
                       "(the NVMe tier needs a block-backed filesystem such as ext4 or xfs)"));
    }
    if (err == ELOOP) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot open ", path, ": it is a symlink, which is never followed"));
    }
    return ErrnoStatus(err, absl::StrCat("cannot open ", path));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::PermissionDeniedError(
        absl::StrCat("cannot open ", path, ": not a regular file"));
  }
  (void)::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return DirectFile(fd, path);
}

DirectFile::DirectFile(DirectFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

DirectFile& DirectFile::operator=(DirectFile&& other) noexcept {
  if (this != &other) {
    (void)Close();
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

DirectFile::~DirectFile() { (void)Close(); }

absl::Status DirectFile::Reserve(uint64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  const int rc = ::posix_fallocate(fd_, 0, static_cast<off_t>(bytes));
  if (rc == 0) return absl::OkStatus();
  if (rc == EOPNOTSUPP || rc == EINVAL) {
    if (::ftruncate(fd_, static_cast<off_t>(bytes)) == 0) return absl::OkStatus();
    return ErrnoStatus(errno, absl::StrCat("cannot size ", path_, " to ", bytes, " bytes"));
  }
  return ErrnoStatus(rc, absl::StrCat("cannot reserve ", bytes, " bytes for ", path_,
                                      " (offset 0 to ", bytes, ")"));
}

absl::StatusOr<uint64_t> DirectFile::Size() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) return ErrnoStatus(errno, absl::StrCat("cannot stat ", path_));
  return static_cast<uint64_t>(st.st_size);
}

absl::Status DirectFile::Sync() {
  if (::fdatasync(fd_) != 0) return ErrnoStatus(errno, absl::StrCat("cannot sync ", path_));
  return absl::OkStatus();
}

absl::Status DirectFile::Close() {
  if (fd_ < 0) return absl::OkStatus();
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) return ErrnoStatus(errno, absl::StrCat("cannot close ", path_));
  return absl::OkStatus();
}

}  // namespace megatrain::engine::tiers
