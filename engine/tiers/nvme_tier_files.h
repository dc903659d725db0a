// The NVMe tier's file names, and the disk space a previous run's files hold in a tier directory
// (a new run replaces them, so that space is the run's to use).
#ifndef MEGATRAIN_ENGINE_TIERS_NVME_TIER_FILES_H_
#define MEGATRAIN_ENGINE_TIERS_NVME_TIER_FILES_H_

#include <cstdint>
#include <string>

namespace megatrain::engine::tiers {

inline constexpr char kOptimizerStateFileName[] = "optimizer_state.bin";
inline constexpr char kGradientFileName[] = "gradients.bin";
inline constexpr char kComputeCopyFileName[] = "compute_copy.bin";

// <nvme_dir>/rank-<rank>: the tier directory of one rank of a job on several processes (ranks
// sharing a machine and an nvme_dir each need their own: the file names are fixed).
std::string RankTierDirectory(const std::string& nvme_dir, int rank);

// Bytes the disk has allocated to the tier's files directly inside `dir`. A run's stores create
// their files truncated (the old inode is unlinked first: DirectFile::kCreateTruncate), so these
// bytes come free when it starts. Symlinks, non-regular files and missing names count nothing;
// a file with several links counts nothing either (unlinking one name frees no blocks).
uint64_t ReplaceableTierFileBytes(const std::string& dir);

}  // namespace megatrain::engine::tiers

#endif  // MEGATRAIN_ENGINE_TIERS_NVME_TIER_FILES_H_
