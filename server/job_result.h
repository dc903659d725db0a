// WriteJobResult: <output_dir>/result.json, the summary of a finished job, whether it ran in
// the daemon's process or as ranks on several machines.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "engine/train/training_run.h"
#include "service/validated_job.h"

namespace megatrain::server {

// Writes result.json into job.output_dir (created when missing; nothing when the job names
// none), never through a symlink planted there. `text_data`: the run trained on text, so the
// unigram entropy is a measured figure (engine::RunDataIsText of the options it ran with).
absl::Status WriteJobResult(const std::string& job_id, const service::ValidatedJob& job,
                            const engine::TrainingRunResult& result, bool text_data);

}  // namespace megatrain::server
