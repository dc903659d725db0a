// Names and listing of checkpoints under a root directory, and keep-last-N retention.
//
// A root holds complete checkpoints named "step-<12-digit step>" and, after a
// crash, leftovers named ".tmp-*" (a checkpoint being written) or ".trash-*"
// (one being deleted). Only "step-*" names are ever read; leftovers are
// removed by the next writer. "lineage/" keeps the provenance records
// (provenance.json and .sig) of checkpoints deleted by retention, so the
// chain of records from the newest checkpoint to the base model stays whole.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace megatrain::engine {

struct CheckpointListing {
  uint64_t step = 0;
  std::string path;
};

// "step-000000000042".
std::string CheckpointDirName(uint64_t step);
// The step of a name made by CheckpointDirName; nullopt for any other name.
std::optional<uint64_t> ParseCheckpointDirName(const std::string& name);

// Complete checkpoints under `root`, ascending by step; empty when `root` does not exist.
absl::StatusOr<std::vector<CheckpointListing>> ListCheckpoints(const std::string& root);
// The newest checkpoint's path, or nullopt when there is none.
absl::StatusOr<std::optional<std::string>> LatestCheckpoint(const std::string& root);

// Provenance records kept under root/lineage, ascending by step; `path` is the
// record's provenance.json copy. Empty when there are none.
absl::StatusOr<std::vector<CheckpointListing>> ListLineageRecords(const std::string& root);

// Deletes all but the newest `keep_last` checkpoints (0 = keep all). Each
// one's provenance record is first copied (durably) to root/lineage, then it
// is renamed to a ".trash-" name, so no partly deleted "step-*" directory is
// ever visible; the root is fsynced. `keep` (the checkpoint just committed) is never deleted,
// whatever its step.
absl::Status ApplyRetention(const std::string& root, int keep_last, const std::string& keep = "");

// Removes ".tmp-*" and ".trash-*" leftovers of interrupted writers/deleters.
absl::Status RemoveCheckpointLeftovers(const std::string& root);

}  // namespace megatrain::engine
