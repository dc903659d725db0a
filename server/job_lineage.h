// A daemon job's lineage (engine/provenance): the SHA-256 of every input (base model files, data
// files, tokenizer), the job spec JSON, the build and the device kind; and the data check made
// before a job continues from a checkpoint.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/provenance/lineage.h"
#include "proto/megatrain.pb.h"
#include "service/job_spec_validation.h"

namespace megatrain::server {

// Hashes every input of `job` (reads all of them: seconds per GB, so the runner thread calls
// it, never an RPC handler). Errors name the file.
absl::StatusOr<provenance::Lineage> BuildJobLineage(const v1::JobSpec& spec,
                                                    const service::ValidatedJob& job,
                                                    const std::string& device_kind);

// The data and tokenizer files of `job` as they are now, hashed (directories expanded).
absl::StatusOr<std::vector<provenance::InputFile>> HashDataInputs(const service::ValidatedJob& job);

// The data/tokenizer files whose hash now differs from what the lineage expects (the submitted
// hash, or the newest allowed change's): old/new hash set, new empty for a file that is gone,
// old empty for a file that appeared in a data directory. allowed_at and reason are left empty.
std::vector<provenance::DataChange> CompareDataInputs(
    const provenance::Lineage& lineage, const std::vector<provenance::InputFile>& current);

// "data file PATH changed since the job's lineage recorded it: sha256 OLD recorded, now NEW; ..."
std::string DescribeDataChanges(const std::vector<provenance::DataChange>& changes);

}  // namespace megatrain::server
