// The NVMe tier's file names, and the disk space a previous run's files hold in a tier directory
// (a new run replaces them, so that space is the run's to use).
#ifndef MEGATRAIN_ENGINE_TIERS_NVME_TIER_FILES_H_
#define MEGATRAIN_ENGINE_TIERS_NVME_TIER_FILES_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace megatrain::engine::tiers {

inline constexpr char kOptimizerStateFileName[] = "optimizer_state.bin";
inline constexpr char kGradientFileName[] = "gradients.bin";
inline constexpr char kComputeCopyFileName[] = "compute_copy.bin";

// <nvme_dir>/rank-<rank>: the tier directory of one rank of a job on several processes (ranks
// sharing a machine and an nvme_dir each need their own: the file names are fixed).
std::string RankTierDirectory(const std::string& nvme_dir, int rank);

// Bytes the disk has allocated to the tier's files directly inside `dir`: a run removes them
// (RemoveTierFiles) before it reserves its own, so these bytes come free when it starts.
// Symlinks, non-regular files and missing names count nothing; a file with several links counts
// nothing either (unlinking one name frees no blocks).
uint64_t ReplaceableTierFileBytes(const std::string& dir);

// Unlinks the tier's file names in `dir` (a previous run's files; the stores always start new
// ones), so their space is free before the first store reserves its file, whichever kinds this
// run puts on NVMe. A symlink is removed, never followed; a missing name or a directory under a
// tier name is left (the store that needs the name reports it). Other failures name the path.
absl::Status RemoveTierFiles(const std::string& dir);

}  // namespace megatrain::engine::tiers

#endif  // MEGATRAIN_ENGINE_TIERS_NVME_TIER_FILES_H_
