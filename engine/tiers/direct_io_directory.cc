// CheckDirectIoDirectory: statfs magic check plus an O_DIRECT write/read probe on an unnamed
// (O_TMPFILE) file, so the probe never follows a planted symlink.
#include "engine/tiers/direct_io_directory.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/unique_fd.h"
#include "engine/tiers/aligned_buffer.h"
#include "engine/tiers/direct_file.h"
#include "engine/tiers/io_status.h"

namespace megatrain::engine::tiers {
namespace {

const char* MemoryFilesystemName(decltype(statfs::f_type) magic) {
  switch (magic) {
    case TMPFS_MAGIC:
      return "tmpfs";
    case RAMFS_MAGIC:
      return "ramfs";
    default:
      return nullptr;
  }
}

}  // namespace

absl::Status CheckDirectIoDirectory(const std::string& dir) {
  // Everything below works on one open descriptor of the directory, so the checks and the probe
  // see the same directory even if the path is swapped meanwhile.
  UniqueFd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir_fd.valid()) {
    const int err = errno;
    if (err == ENOTDIR) {
      return absl::FailedPreconditionError(
          absl::StrCat("NVMe tier directory nvme_dir=", dir, " is not a directory"));
    }
    return ErrnoStatus(err, absl::StrCat("NVMe tier directory nvme_dir=", dir));
  }
  struct statfs fs;
  if (::fstatfs(dir_fd.get(), &fs) != 0) {
    return ErrnoStatus(errno, absl::StrCat("cannot statfs nvme_dir=", dir));
  }
  if (const char* name = MemoryFilesystemName(fs.f_type); name != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "nvme_dir=", dir, " is on ", name,
        ", which keeps files in RAM: the NVMe tier would silently use host memory beyond the "
        "RAM budget. Use a directory on a block-backed filesystem (ext4, xfs) on the NVMe drive"));
  }
  // The probe is an unnamed file (O_TMPFILE): no name exists that a local user could plant a
  // symlink at, and nothing is left behind. Filesystems without O_TMPFILE get a named file
  // created with O_EXCL|O_NOFOLLOW under a random name, unlinked at once.
  const int flags = O_RDWR | O_DIRECT | O_CLOEXEC;
  std::string probe_name;
  UniqueFd probe(::openat(dir_fd.get(), ".", flags | O_TMPFILE, 0600));
  if (!probe.valid() && (errno == EOPNOTSUPP || errno == EISDIR)) {
    uint64_t r = 0;
    if (::getrandom(&r, sizeof(r), 0) != sizeof(r)) r = static_cast<uint64_t>(::getpid());
    probe_name = absl::StrFormat(".megatrain_odirect_probe.%016x", r);
    probe.Reset(::openat(dir_fd.get(), probe_name.c_str(), flags | O_CREAT | O_EXCL | O_NOFOLLOW,
                         0600));
    if (probe.valid()) ::unlinkat(dir_fd.get(), probe_name.c_str(), 0);
  }
  if (!probe.valid()) {
    const int err = errno;
    const std::string why =
        err == EINVAL ? std::string("the filesystem does not support direct I/O (O_DIRECT)")
                      : absl::StrCat("cannot create a probe file: ", std::strerror(err));
    return absl::FailedPreconditionError(
        absl::StrCat("nvme_dir=", dir, " cannot be used for the NVMe tier: ", why));
  }
  absl::StatusOr<AlignedBuffer> block = AlignedBuffer::Allocate(kDirectIoAlignment);
  if (!block.ok()) return block.status();
  std::memset(block->data(), 0x5a, kDirectIoAlignment);
  absl::Status status;
  if (::pwrite(probe.get(), block->data(), kDirectIoAlignment, 0) !=
      static_cast<ssize_t>(kDirectIoAlignment)) {
    status = ErrnoStatus(errno, absl::StrCat("O_DIRECT probe write in ", dir));
  } else if (::pread(probe.get(), block->data(), kDirectIoAlignment, 0) !=
             static_cast<ssize_t>(kDirectIoAlignment)) {
    status = ErrnoStatus(errno, absl::StrCat("O_DIRECT probe read in ", dir));
  }
  if (!status.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("nvme_dir=", dir, " failed the O_DIRECT probe: ", status.message()));
  }
  return absl::OkStatus();
}

}  // namespace megatrain::engine::tiers
