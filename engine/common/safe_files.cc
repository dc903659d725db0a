// Regular-file-only input opening and symlink-proof output writing (see safe_files.h).
#include "engine/common/safe_files.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/file_io.h"

namespace megatrain::engine {
namespace {

absl::Status OpenError(int err, const std::string& what) {
  if (err == ELOOP) {
    return absl::PermissionDeniedError(absl::StrCat(what, ": is a symlink (not followed)"));
  }
  return ErrnoStatus(err, what);
}

std::string RandomSuffix() {
  uint64_t r = 0;
  if (getrandom(&r, sizeof(r), 0) != sizeof(r)) {
    r = static_cast<uint64_t>(::getpid()) * 0x9e3779b97f4a7c15ull ^
        static_cast<uint64_t>(reinterpret_cast<uintptr_t>(&r));
  }
  return absl::StrFormat("%016x", r);
}

}  // namespace

const char* FileTypeName(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symlink";
  return "not a regular file";
}

absl::StatusOr<UniqueFd> OpenRegularFileForRead(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (!fd.valid()) return OpenError(errno, absl::StrCat("cannot open '", path, "'"));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return OpenError(errno, absl::StrCat("cannot stat '", path, "'"));
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is ", FileTypeName(st.st_mode), ", not a regular file"));
  }
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags >= 0) (void)::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes) {
  absl::StatusOr<UniqueFd> fd = OpenRegularFileForRead(path);
  if (!fd.ok()) return fd.status();
  struct stat st;
  if (::fstat(fd->get(), &st) != 0) return OpenError(errno, absl::StrCat("cannot stat '", path, "'"));
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("'", path, "' has ", st.st_size, " bytes, more than ", max_bytes));
  }
  return ReadAll(fd->get(), absl::StrCat("'", path, "'"), max_bytes);
}

absl::StatusOr<UniqueFd> OpenDirectory(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return OpenError(errno, absl::StrCat("cannot open directory '", dir, "'"));
  return fd;
}

namespace {
constexpr size_t kWriterBufferBytes = size_t{4} << 20;
}  // namespace

absl::StatusOr<FileInDirectoryWriter> FileInDirectoryWriter::Create(const std::string& dir,
                                                                    const std::string& name,
                                                                    mode_t mode) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not a file name"));
  }
  FileInDirectoryWriter w;
  absl::StatusOr<UniqueFd> dir_fd = OpenDirectory(dir);
  if (!dir_fd.ok()) return dir_fd.status();
  w.dir_fd_ = *std::move(dir_fd);
  w.dir_ = dir;
  w.name_ = name;
  w.tmp_ = absl::StrCat(".", name, ".", RandomSuffix(), ".tmp");
  w.fd_ = UniqueFd(::openat(w.dir_fd_.get(), w.tmp_.c_str(),
                            O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode));
  if (!w.fd_.valid()) {
    const int err = errno;
    w.tmp_.clear();  // nothing of ours to remove
    return OpenError(err, absl::StrCat("cannot create '", dir, "/.", name, ".*.tmp'"));
  }
  w.buffer_.reserve(kWriterBufferBytes);
  return w;
}

FileInDirectoryWriter::FileInDirectoryWriter(FileInDirectoryWriter&& other) noexcept
    : dir_(std::move(other.dir_)),
      name_(std::move(other.name_)),
      tmp_(std::exchange(other.tmp_, std::string())),
      dir_fd_(std::move(other.dir_fd_)),
      fd_(std::move(other.fd_)),
      buffer_(std::move(other.buffer_)),
      written_(other.written_) {}

FileInDirectoryWriter& FileInDirectoryWriter::operator=(FileInDirectoryWriter&& other) noexcept {
  if (this != &other) {
    Discard();
    dir_ = std::move(other.dir_);
    name_ = std::move(other.name_);
    tmp_ = std::exchange(other.tmp_, std::string());
    dir_fd_ = std::move(other.dir_fd_);
    fd_ = std::move(other.fd_);
    buffer_ = std::move(other.buffer_);
    written_ = other.written_;
  }
  return *this;
}

FileInDirectoryWriter::~FileInDirectoryWriter() { Discard(); }

void FileInDirectoryWriter::Discard() {
  fd_ = UniqueFd();
  if (!tmp_.empty() && dir_fd_.valid()) ::unlinkat(dir_fd_.get(), tmp_.c_str(), 0);
  tmp_.clear();
}

absl::Status FileInDirectoryWriter::Flush() {
  if (buffer_.empty()) return absl::OkStatus();
  if (absl::Status s = WriteAll(fd_.get(), buffer_, absl::StrCat(dir_, "/", tmp_)); !s.ok()) {
    Discard();
    return s;
  }
  written_ += buffer_.size();
  buffer_.clear();
  return absl::OkStatus();
}

absl::Status FileInDirectoryWriter::Append(std::string_view bytes) {
  if (!fd_.valid()) return absl::FailedPreconditionError(absl::StrCat(dir_, "/", name_, ": writer is closed"));
  if (buffer_.size() + bytes.size() > kWriterBufferBytes) {
    if (absl::Status s = Flush(); !s.ok()) return s;
  }
  if (bytes.size() >= kWriterBufferBytes) {
    if (absl::Status s = WriteAll(fd_.get(), bytes, absl::StrCat(dir_, "/", tmp_)); !s.ok()) {
      Discard();
      return s;
    }
    written_ += bytes.size();
    return absl::OkStatus();
  }
  buffer_.append(bytes);
  return absl::OkStatus();
}

absl::Status FileInDirectoryWriter::Commit() {
  if (!fd_.valid()) return absl::FailedPreconditionError(absl::StrCat(dir_, "/", name_, ": writer is closed"));
  if (absl::Status s = Flush(); !s.ok()) return s;
  auto fail = [&](const std::string& what) {
    const absl::Status s = OpenError(errno, absl::StrCat(what, " '", dir_, "/", tmp_, "'"));
    Discard();
    return s;
  };
  if (::fsync(fd_.get()) != 0) return fail("cannot fsync");
  if (::close(fd_.Release()) != 0) return fail("cannot close");
  if (::renameat(dir_fd_.get(), tmp_.c_str(), dir_fd_.get(), name_.c_str()) != 0) {
    const int err = errno;
    const absl::Status s = OpenError(
        err, absl::StrCat("cannot rename '", dir_, "/", tmp_, "' to '", name_, "'"));
    Discard();
    return s;
  }
  tmp_.clear();
  (void)::fsync(dir_fd_.get());
  return absl::OkStatus();
}

absl::Status WriteFileInDirectory(const std::string& dir, const std::string& name,
                                  std::string_view contents, mode_t mode) {
  absl::StatusOr<FileInDirectoryWriter> writer = FileInDirectoryWriter::Create(dir, name, mode);
  if (!writer.ok()) return writer.status();
  if (absl::Status s = writer->Append(contents); !s.ok()) return s;
  return writer->Commit();
}

absl::Status MakeDirectories(const std::string& path, mode_t mode) {
  if (path.empty()) return absl::InvalidArgumentError("empty directory path");
  std::string prefix;
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t next = path.find('/', pos);
    if (next == std::string::npos) next = path.size();
    prefix = path.substr(0, next);
    pos = next + 1;
    if (prefix.empty()) continue;  // the leading '/'
    if (::mkdir(prefix.c_str(), mode) == 0) continue;
    const int err = errno;
    struct stat st;
    if (err == EEXIST && ::stat(prefix.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) continue;
    if (err == EEXIST) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create directory '", path, "': '", prefix, "' is not a directory"));
    }
    return OpenError(err, absl::StrCat("cannot create directory '", prefix, "'"));
  }
  return absl::OkStatus();
}

}  // namespace megatrain::engine
