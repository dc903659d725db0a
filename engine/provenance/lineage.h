// Lineage: what a training job was made from (the SHA-256 of each input file,
// the job spec, the build, the device kind, and allowed data changes), with
// its JSON form as stored in every provenance record.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/common/input_files.h"

namespace megatrain::provenance {

inline constexpr char kRoleBaseModel[] = "base_model";
inline constexpr char kRoleData[] = "data";
inline constexpr char kRoleTokenizer[] = "tokenizer";

struct InputFile {
  std::string role;  // kRoleBaseModel, kRoleData or kRoleTokenizer
  std::string path;
  std::string sha256_hex;
  uint64_t bytes = 0;
  bool operator==(const InputFile&) const = default;
};

// A data file that changed between a pause and a resume, allowed by the user.
struct DataChange {
  std::string path;
  std::string old_sha256_hex;
  std::string new_sha256_hex;
  std::string allowed_at;  // RFC 3339 time
  std::string reason;
  bool operator==(const DataChange&) const = default;
};

struct BuildInfo {
  std::string version;
  std::string commit;    // "unknown" when the build was not stamped
  std::string compiler;  // __VERSION__ of the compiler that built the writer
  bool operator==(const BuildInfo&) const = default;
};

struct Lineage {
  std::string job_spec_json = "{}";  // kept verbatim (text), so it round-trips exactly
  std::vector<InputFile> inputs;
  BuildInfo build;
  std::string device_kind;
  std::vector<DataChange> data_changes;
  bool operator==(const Lineage&) const = default;
};

// This binary's build: version, the source commit when the binary links
// //engine/provenance:build_commit ("unknown" otherwise), compiler.
BuildInfo CurrentBuild();

nlohmann::ordered_json LineageToJsonValue(const Lineage& lineage);
// Strict: unknown or missing keys and wrong types are InvalidArgument errors
// starting with `source`.
absl::StatusOr<Lineage> LineageFromJsonValue(const nlohmann::json& value,
                                             const std::string& source);
std::string LineageToJson(const Lineage& lineage);
absl::StatusOr<Lineage> ParseLineage(std::string_view text, const std::string& source);

// SHA-256 and size of each path, in order, all with `role`; a directory
// contributes its regular files (recursively, sorted by path: a model directory).
// A corpus is hashed as engine::ExpandCorpusFiles lists it, the files training
// reads, never as a directory. Errors name the path. A file held in `inputs` (the daemon's
// descriptors checked when the job started) is hashed through its descriptor, so the lineage
// describes what the run reads; with a set, a directory's files outside it (what the run never
// reads) are skipped, never opened; without one, files are hashed by path.
absl::StatusOr<std::vector<InputFile>> HashInputs(const std::string& role,
                                                  const std::vector<std::string>& paths,
                                                  const engine::InputFiles* inputs = nullptr);

}  // namespace megatrain::provenance
