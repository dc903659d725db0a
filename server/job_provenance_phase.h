// The provenance phase of a run (job_runner.h, protocol 6): a job's lineage built at its first
// run, or its data compared with the lineage before it continues (a change refuses the run unless
// the resume allowed it), and the job as the engine then runs it (lineage, signer). It reads and
// hashes files but touches no runner state: the runner records what it decides under its lock.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/provenance/lineage.h"
#include "engine/provenance/signing_key.h"
#include "proto/megatrain.pb.h"
#include "service/job_spec_validation.h"

namespace megatrain::server {

struct ProvenanceAuditRow {
  std::string kind;
  std::string message;
};

struct ProvenanceDecision {
  // Set when changed or unreadable data keeps the job from continuing: the job goes to PAUSED
  // with this message, and nothing is recorded.
  std::string refusal;
  provenance::Lineage lineage;  // the lineage this run trains under
  // The lineage is new or records newly allowed data changes: the runner stores it, appends
  // `audit` to the job's chain and logs `allowed_changes` (when not 0), in one critical section.
  bool record = false;
  std::vector<ProvenanceAuditRow> audit;
  size_t allowed_changes = 0;
};

// `recorded`: the job's lineage from an earlier run, if any; `allow_data_change`: the resume that
// queued this run allowed changed data. Hashes files (seconds per GB): call it without the
// runner's lock. Errors fail the job.
absl::StatusOr<ProvenanceDecision> DecideProvenance(
    const std::string& id, const v1::JobSpec& spec, const service::ValidatedJob& validated,
    const std::optional<provenance::Lineage>& recorded, bool allow_data_change,
    const std::string& device_kind);

// `validated` as the engine runs it: under `lineage`, its checkpoints signed by `signer` (null:
// unsigned).
service::ValidatedJob WithProvenance(const service::ValidatedJob& validated,
                                     const provenance::Lineage& lineage,
                                     std::shared_ptr<const provenance::SigningKey> signer);

}  // namespace megatrain::server
