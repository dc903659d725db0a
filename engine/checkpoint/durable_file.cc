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
#include "engine/common/file_io.h"
#include "engine/common/unique_fd.h"

namespace megatrain::engine {

absl::StatusOr<DurableFileWriter> DurableFileWriter::Create(const std::string& path,
                                                            bool with_sha256) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat(path, ": cannot create"));
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
  return WriteAll(fd_, data, path_);
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
    return ErrnoStatus(err, absl::StrCat(path_, ": fsync failed"));
  }
  if (::close(fd) != 0) return ErrnoStatus(errno, absl::StrCat(path_, ": close failed"));
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
    return ErrnoStatus(errno, absl::StrCat(tmp, ": cannot remove leftover"));
  }
  if (absl::StatusOr<FileChecksum> written = WriteDurableFile(tmp, text); !written.ok()) {
    return written.status();
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    return ErrnoStatus(errno, absl::StrCat(path, ": cannot rename to"));
  const size_t slash = path.rfind('/');
  return FsyncDirectory(slash == std::string::npos ? "." : path.substr(0, slash + 1));
}

absl::Status FsyncDirectory(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat(path, ": cannot open directory"));
  if (::fsync(fd.get()) != 0)
    return ErrnoStatus(errno, absl::StrCat(path, ": directory fsync failed"));
  return absl::OkStatus();
}

absl::StatusOr<FileChecksum> ChecksumFile(const std::string& path, bool follow_symlinks) {
  // Non-blocking: a FIFO swapped in under the name must not hang the open.
  UniqueFd fd(::open(path.c_str(),
                     O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | (follow_symlinks ? 0 : O_NOFOLLOW)));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat(path, ": cannot open"));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, absl::StrCat(path, ": cannot stat"));
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": not a regular file"));
  }
  return ChecksumDescriptor(fd.get(), path);
}

absl::StatusOr<FileChecksum> ChecksumDescriptor(int fd, const std::string& path) {
  std::vector<uint8_t> chunk(size_t{4} << 20);
  FileChecksum sum;
  while (true) {
    const ssize_t n = ::pread(fd, chunk.data(), chunk.size(), static_cast<off_t>(sum.bytes));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, absl::StrCat(path, ": read failed"));
    }
    if (n == 0) break;
    sum.crc32c =
        Crc32cExtend(sum.crc32c, absl::MakeConstSpan(chunk.data(), static_cast<size_t>(n)));
    sum.bytes += static_cast<uint64_t>(n);
  }
  return sum;
}

std::string FormatCrc32c(uint32_t crc) { return absl::StrFormat("0x%08x", crc); }

}  // namespace megatrain::engine
