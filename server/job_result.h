// WriteJobResult: <output_dir>/result.json, the summary of a finished job, whether it ran in
// the daemon's process or as ranks on several machines; and TrainingRunResult as JSON, how a
// job's rank 0 hands its result to the daemon.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/train/training_run.h"
#include "nlohmann/json.hpp"
#include "service/validated_job.h"

namespace megatrain::server {

// Writes result.json into job.output_dir (created when missing; nothing when the job names
// none), never through a symlink planted there. `text_data`: the run trained on text, so the
// unigram entropy is a measured figure (engine::RunDataIsText of the options it ran with).
absl::Status WriteJobResult(const std::string& job_id, const service::ValidatedJob& job,
                            const engine::TrainingRunResult& result, bool text_data);

nlohmann::json TrainingRunResultToJson(const engine::TrainingRunResult& result);
// INVALID_ARGUMENT naming the key when one has the wrong type; missing keys keep defaults.
absl::StatusOr<engine::TrainingRunResult> TrainingRunResultFromJson(const nlohmann::json& value);

}  // namespace megatrain::server
