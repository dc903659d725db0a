// CheckDirectIoDirectory: statfs magic check plus an O_DIRECT write/read probe.
#include "engine/tiers/direct_io_directory.h"

#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
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
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    return ErrnoStatus(errno, absl::StrCat("NVMe tier directory nvme_dir=", dir));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("NVMe tier directory nvme_dir=", dir, " is not a directory"));
  }
  struct statfs fs;
  if (::statfs(dir.c_str(), &fs) != 0) {
    return ErrnoStatus(errno, absl::StrCat("cannot statfs nvme_dir=", dir));
  }
  if (const char* name = MemoryFilesystemName(fs.f_type); name != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "nvme_dir=", dir, " is on ", name,
        ", which keeps files in RAM: the NVMe tier would silently use host memory beyond the "
        "RAM budget. Use a directory on a block-backed filesystem (ext4, xfs) on the NVMe drive"));
  }
  const std::string probe_path = absl::StrCat(dir, "/.megatrain_odirect_probe.", ::getpid());
  absl::StatusOr<DirectFile> probe =
      DirectFile::Open(probe_path, DirectFile::Mode::kCreateTruncate);
  if (!probe.ok()) {
    ::unlink(probe_path.c_str());
    return absl::FailedPreconditionError(absl::StrCat(
        "nvme_dir=", dir, " cannot be used for the NVMe tier: ", probe.status().message()));
  }
  absl::StatusOr<AlignedBuffer> block = AlignedBuffer::Allocate(kDirectIoAlignment);
  if (!block.ok()) return block.status();
  std::memset(block->data(), 0x5a, kDirectIoAlignment);
  absl::Status status;
  if (::pwrite(probe->fd(), block->data(), kDirectIoAlignment, 0) !=
      static_cast<ssize_t>(kDirectIoAlignment)) {
    status = ErrnoStatus(errno, absl::StrCat("O_DIRECT probe write to ", probe_path));
  } else if (::pread(probe->fd(), block->data(), kDirectIoAlignment, 0) !=
             static_cast<ssize_t>(kDirectIoAlignment)) {
    status = ErrnoStatus(errno, absl::StrCat("O_DIRECT probe read from ", probe_path));
  }
  (void)probe->Close();
  ::unlink(probe_path.c_str());
  if (!status.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("nvme_dir=", dir, " failed the O_DIRECT probe: ", status.message()));
  }
  return absl::OkStatus();
}

}  // namespace megatrain::engine::tiers
