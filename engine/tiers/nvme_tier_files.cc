// The disk space a previous run's NVMe-tier files hold in a directory.
#include "engine/tiers/nvme_tier_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "engine/common/file_io.h"

namespace megatrain::engine::tiers {

std::string RankTierDirectory(const std::string& nvme_dir, int rank) {
  return nvme_dir + "/rank-" + std::to_string(rank);
}

uint64_t ReplaceableTierFileBytes(const std::string& dir) {
  uint64_t total = 0;
  for (const char* name : {kOptimizerStateFileName, kGradientFileName, kComputeCopyFileName}) {
    const std::string path = dir + "/" + name;
    struct stat st {};
    if (::fstatat(AT_FDCWD, path.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (!S_ISREG(st.st_mode) || st.st_nlink != 1) continue;
    total += static_cast<uint64_t>(st.st_blocks) * 512;  // st_blocks is in 512-byte units
  }
  return total;
}

absl::Status RemoveTierFiles(const std::string& dir) {
  for (const char* name : {kOptimizerStateFileName, kGradientFileName, kComputeCopyFileName}) {
    const std::string path = dir + "/" + name;
    if (::unlink(path.c_str()) == 0 || errno == ENOENT || errno == EISDIR) continue;
    return engine::ErrnoStatus(errno, "cannot remove the previous run's " + path);
  }
  return absl::OkStatus();
}

}  // namespace megatrain::engine::tiers
