// The checkpoint manifest (manifest.json): format version, build, and the size
// and CRC32C of every file of the checkpoint and of the training data files;
// and the verification of a checkpoint directory against it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/checkpoint/durable_file.h"
#include "engine/common/input_files.h"

namespace megatrain::engine {

// Version 1: manifest.json, config.json, model weights (model.safetensors or
// model-0000N-of-0000M.safetensors + model.safetensors.index.json),
// optimizer.safetensors, trainer_state.json. Any other version is refused.
inline constexpr int kCheckpointFormatVersion = 1;
inline constexpr char kManifestFileName[] = "manifest.json";
inline constexpr char kManifestFormatName[] = "megatrain-checkpoint";

struct ManifestFileRecord {
  std::string name;  // a plain file name inside the checkpoint directory
  FileChecksum checksum;
};

struct DataFileRecord {
  std::string path;  // as given to the job
  FileChecksum checksum;
  bool operator==(const DataFileRecord&) const = default;
};

struct CheckpointManifest {
  int version = kCheckpointFormatVersion;
  std::string build_version;
  uint64_t step = 0;
  std::string model_dtype;  // safetensors dtype name of the model files: "F32", "BF16", "F16"
  std::vector<ManifestFileRecord> files;  // every file of the directory but the manifest
  std::vector<DataFileRecord> data_files;
};

// JSON text of the manifest. It carries "manifest_crc32c", the CRC32C of its
// own compact rendering without that key, so a damaged manifest is detected.
std::string ManifestToJson(const CheckpointManifest& manifest);

// Strict: unknown or missing keys, a version other than
// kCheckpointFormatVersion, bad file names and a wrong manifest_crc32c are
// InvalidArgument errors starting with `source`.
absl::StatusOr<CheckpointManifest> ParseManifest(std::string_view text, const std::string& source);

// Reads `dir`/manifest.json and checks every file of `dir` against it: each
// listed file exists with the recorded size and CRC32C, and no unlisted file
// is present besides the provenance record (provenance.json, provenance.sig),
// which covers the manifest and is checked by provenance_verify.h. The error names the file
// and what is wrong (missing, truncated or grown, corrupted, unexpected). Returns the manifest.
absl::StatusOr<CheckpointManifest> VerifyCheckpointDirectory(const std::string& dir);

// Size and CRC32C of each data file, in order; from its checked descriptor in `inputs` when
// given (a daemon's run).
absl::StatusOr<std::vector<DataFileRecord>> ChecksumDataFiles(const std::vector<std::string>& paths,
                                                              const InputFiles* inputs = nullptr);

// OK when `current` has the same files with the same checksums as `recorded`;
// otherwise FailedPrecondition naming the first data file that differs.
absl::Status CheckDataFilesMatch(const std::vector<DataFileRecord>& recorded,
                                 const std::vector<DataFileRecord>& current);

}  // namespace megatrain::engine
