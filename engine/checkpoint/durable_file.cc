// POSIX implementation of the checkpoint file helpers.
#include "engine/checkpoint/durable_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/crc32c.h"

namespace megatrain::engine {
namespace {

absl::Status ErrnoError(const char* what, const std::string& path, int err) {
  const std::string message = absl::StrCat(path, ": ", what, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(message);
    case EEXIST:
      return absl::AlreadyExistsError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

absl::StatusOr<DurableFileWriter> DurableFileWriter::Create(const std::string& path,
                                                            bool with_sha256) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot create", path, errno);
  DurableFileWriter w;
  w.path_ = path;
  w.fd_ = fd;
  if (with_sha256) w.sha256_.emplace();
  return w;
}

DurableFileWriter::DurableFileWriter(DurableFileWriter&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(other.fd_),
      checksum_(other.checksum_),
      sha256_(std::move(other.sha256_)),
      sha256_hex_(std::move(other.sha256_hex_)) {
  other.fd_ = -1;
}

DurableFileWriter& DurableFileWriter::operator=(DurableFileWriter&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = other.fd_;
    checksum_ = other.checksum_;
    sha256_ = std::move(other.sha256_);
    sha256_hex_ = std::move(other.sha256_hex_);
    other.fd_ = -1;
  }
  return *this;
}

DurableFileWriter::~DurableFileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status DurableFileWriter::Append(absl::Span<const uint8_t> data) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": writer is closed"));
  checksum_.crc32c = Crc32cExtend(checksum_.crc32c, data);
  checksum_.bytes += data.size();
  if (sha256_.has_value()) sha256_->Update(data);
  const uint8_t* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("write failed", path_, errno);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status DurableFileWriter::Append(std::string_view text) {
  return Append(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

absl::Status DurableFileWriter::Close() {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": writer is closed"));
  const int fd = fd_;
  fd_ = -1;
  if (sha256_.has_value()) sha256_hex_ = sha256_->FinalHex();
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError("fsync failed", path_, err);
  }
  if (::close(fd) != 0) return ErrnoError("close failed", path_, errno);
  return absl::OkStatus();
}

absl::StatusOr<FileChecksum> WriteDurableFile(const std::string& path, std::string_view text) {
  absl::StatusOr<DurableFileWriter> w = DurableFileWriter::Create(path);
  if (!w.ok()) return w.status();
  if (absl::Status s = w->Append(text); !s.ok()) return s;
  if (absl::Status s = w->Close(); !s.ok()) return s;
  return w->checksum();
}

absl::Status ReplaceFileDurably(const std::string& path, std::string_view text) {
  const std::string tmp = path + ".tmp";
  if (::unlink(tmp.c_str()) != 0 && errno != ENOENT) {
    return ErrnoError("cannot remove leftover", tmp, errno);
  }
  if (absl::StatusOr<FileChecksum> written = WriteDurableFile(tmp, text); !written.ok()) {
    return written.status();
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) return ErrnoError("cannot rename to", path, errno);
  const size_t slash = path.rfind('/');
  return FsyncDirectory(slash == std::string::npos ? "." : path.substr(0, slash + 1));
}

absl::Status FsyncDirectory(const std::string& path) {
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError("cannot open directory", path, errno);
  if (::fsync(fd.get()) != 0) return ErrnoError("directory fsync failed", path, errno);
  return absl::OkStatus();
}

absl::StatusOr<FileChecksum> ChecksumFile(const std::string& path) {
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError("cannot open", path, errno);
  std::vector<uint8_t> chunk(size_t{4} << 20);
  FileChecksum sum;
  while (true) {
    const ssize_t n = ::read(fd.get(), chunk.data(), chunk.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("read failed", path, errno);
    }
    if (n == 0) break;
    sum.crc32c =
        Crc32cExtend(sum.crc32c, absl::MakeConstSpan(chunk.data(), static_cast<size_t>(n)));
    sum.bytes += static_cast<uint64_t>(n);
  }
  return sum;
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, uint64_t max_bytes) {
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError("cannot open", path, errno);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoError("stat failed", path, errno);
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", st.st_size, " bytes, more than the limit of ", max_bytes));
  }
  std::string text;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd.get(), buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("read failed", path, errno);
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
    if (text.size() > max_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": more than the limit of ", max_bytes, " bytes"));
    }
  }
  return text;
}

std::string FormatCrc32c(uint32_t crc) { return absl::StrFormat("0x%08x", crc); }

}  // namespace megatrain::engine
