// DecideProvenance and WithProvenance (see job_provenance_phase.h).
#include "server/job_provenance_phase.h"

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/job_lineage.h"

namespace megatrain::server {

absl::StatusOr<ProvenanceDecision> DecideProvenance(
    const std::string& id, const v1::JobSpec& spec, const service::ValidatedJob& validated,
    const std::optional<provenance::Lineage>& recorded, bool allow_data_change,
    const std::string& device_kind) {
  ProvenanceDecision decision;
  if (!recorded.has_value()) {
    absl::StatusOr<provenance::Lineage> built = BuildJobLineage(spec, validated, device_kind);
    if (!built.ok()) {
      return absl::Status(built.status().code(),
                          absl::StrCat("lineage: ", built.status().message()));
    }
    uint64_t bytes = 0;
    for (const provenance::InputFile& f : built->inputs) bytes += f.bytes;
    decision.audit.push_back(
        {"lineage_recorded", absl::StrCat(built->inputs.size(), " input files (", bytes,
                                          " bytes) hashed; build ", built->build.version, " ",
                                          built->build.commit, "; device ", built->device_kind)});
    decision.lineage = *std::move(built);
    decision.record = true;
    return decision;
  }
  decision.lineage = *recorded;
  absl::StatusOr<std::vector<provenance::InputFile>> current = HashDataInputs(validated);
  if (!current.ok()) {
    decision.refusal = absl::StrCat("data check before continuing: ", current.status().message(),
                                    "; the job is PAUSED until the data is back");
    return decision;
  }
  std::vector<provenance::DataChange> changes = CompareDataInputs(decision.lineage, *current);
  if (!changes.empty() && !allow_data_change) {
    decision.refusal = absl::StrCat(DescribeDataChanges(changes),
                                    ". The job is PAUSED: restore the data, or continue with it: "
                                    "megatrain resume ",
                                    id, " --allow-data-change");
    return decision;
  }
  if (!changes.empty()) {
    const std::string now = absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone());
    for (provenance::DataChange& c : changes) {
      c.allowed_at = now;
      c.reason = "megatrain resume --allow-data-change";
      decision.lineage.data_changes.push_back(c);
      decision.audit.push_back({"data_change_allowed", DescribeDataChanges({c})});
    }
    decision.record = true;
    decision.allowed_changes = changes.size();
  }
  return decision;
}

service::ValidatedJob WithProvenance(const service::ValidatedJob& validated,
                                     const provenance::Lineage& lineage,
                                     std::shared_ptr<const provenance::SigningKey> signer) {
  service::ValidatedJob run = validated;
  run.options.lineage = lineage;
  run.options.signer = std::move(signer);
  // The SHA-256 check of the provenance phase is the data check of this run; the checkpoint's
  // CRC32Cs still describe the data from before an allowed change.
  run.options.allow_changed_data_files = !lineage.data_changes.empty();
  return run;
}

}  // namespace megatrain::server
