// CheckHfDirectoryFiles: the files of a Hugging Face model directory that the engine may read
// (config.json, other *.json such as the shard index, *.safetensors, the tokenizer files that
// checkpoints carry) get the confinement of any
// request path (resolved under a data root, regular files only: a FIFO, device or socket is
// refused without being opened) and size caps on the JSON files (issue 16, point 2), before
// anything in the directory is parsed.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "service/path_policy.h"

namespace megatrain::service {

inline constexpr uint64_t kMaxHfConfigBytes = uint64_t{1} << 20;      // as config_json_path
inline constexpr uint64_t kMaxHfOtherJsonBytes = uint64_t{64} << 20;  // shard indexes
inline constexpr int kMaxHfDirectoryEntries = 4096;

// The files of the directory the engine reads (and the daemon holds for the run): *.json,
// *.safetensors and the tokenizer / generation files (engine/model/hf_companion_files.h).
bool IsHeldHfDirectoryFile(const std::string& name);
// The size cap of such a file: config.json 1 MiB, other JSON and companion files 64 MiB,
// weights none.
uint64_t HfDirectoryFileCap(const std::string& name);

// `dir` is the resolved model.hf_directory. Errors start with "model.hf_directory" and name the
// file: PERMISSION_DENIED (outside the roots, unreadable), INVALID_ARGUMENT (not a regular
// file), RESOURCE_EXHAUSTED (over a cap, too many entries).
absl::Status CheckHfDirectoryFiles(const std::string& dir, const PathPolicy& paths);

}  // namespace megatrain::service
