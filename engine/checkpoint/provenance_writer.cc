// Writing a checkpoint's provenance record (see provenance_writer.h).
#include "engine/checkpoint/provenance_writer.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "engine/checkpoint/checkpoint_directory.h"
#include "engine/checkpoint/durable_file.h"
#include "engine/common/safe_files.h"
#include "engine/provenance/sha256.h"

namespace megatrain::engine {
namespace {

namespace fs = std::filesystem;

}  // namespace

absl::StatusOr<provenance::PreviousLink> FindPreviousLink(const std::string& root, uint64_t step,
                                                          const provenance::PreviousLink& origin) {
  absl::StatusOr<std::vector<CheckpointListing>> dirs = ListCheckpoints(root);
  if (!dirs.ok()) return dirs.status();
  absl::StatusOr<std::vector<CheckpointListing>> kept = ListLineageRecords(root);
  if (!kept.ok()) return kept.status();
  std::optional<CheckpointListing> best;  // path = the record file
  bool best_is_dir = false;
  for (const CheckpointListing& d : *dirs) {
    if (d.step < step && (!best.has_value() || d.step >= best->step)) {
      best = CheckpointListing{d.step, d.path};
      best_is_dir = true;
    }
  }
  for (const CheckpointListing& k : *kept) {
    if (k.step < step && (!best.has_value() || k.step > best->step)) {
      best = k;
      best_is_dir = false;
    }
  }
  if (!best.has_value()) return origin;
  std::string record_path = best->path;
  if (best_is_dir) {
    record_path = absl::StrCat(best->path, "/", provenance::kProvenanceFileName);
    std::error_code ec;
    if (!fs::exists(record_path, ec)) {
      // A checkpoint written before provenance records existed.
      provenance::PreviousLink link;
      link.kind = provenance::PreviousLink::Kind::kUnrecorded;
      link.reason =
          absl::StrCat(CheckpointDirName(best->step), " has no ", provenance::kProvenanceFileName);
      return link;
    }
  }
  absl::StatusOr<std::string> text = ReadRegularFile(record_path, provenance::kMaxProvenanceBytes);
  if (!text.ok()) return text.status();
  provenance::PreviousLink link;
  link.kind = provenance::PreviousLink::Kind::kCheckpoint;
  link.step = best->step;
  link.dir_name = CheckpointDirName(best->step);
  link.provenance_sha256_hex = provenance::Sha256Hex(*text);
  return link;
}

absl::Status WriteProvenanceFiles(const std::string& dir, const std::string& root, uint64_t step,
                                  const std::string& job_json,
                                  const provenance::ProvenanceContext* context,
                                  std::vector<provenance::FileDigest> files) {
  provenance::ProvenanceRecord record;
  record.step = step;
  record.files = std::move(files);
  provenance::PreviousLink origin;
  if (context != nullptr) {
    record.lineage = context->lineage;
    origin = context->origin;
  } else {
    record.lineage.job_spec_json = job_json;
    origin.kind = provenance::PreviousLink::Kind::kUnrecorded;
    origin.reason = "the checkpoint writer was given no provenance context";
  }
  // The build is the writer's own: a resumed job may run a newer binary.
  record.lineage.build = provenance::CurrentBuild();
  absl::StatusOr<provenance::PreviousLink> previous = FindPreviousLink(root, step, origin);
  if (!previous.ok()) return previous.status();
  record.previous = *std::move(previous);
  const std::string json = provenance::ProvenanceToJson(record);
  if (absl::StatusOr<FileChecksum> s =
          WriteDurableFile(absl::StrCat(dir, "/", provenance::kProvenanceFileName), json);
      !s.ok()) {
    return s.status();
  }
  if (context == nullptr || context->signer == nullptr) return absl::OkStatus();
  const std::string signature =
      provenance::SignatureToJson(provenance::SignProvenance(*context->signer, json));
  return WriteDurableFile(absl::StrCat(dir, "/", provenance::kSignatureFileName), signature)
      .status();
}

}  // namespace megatrain::engine
