// WriteJobResult and the TrainingRunResult JSON (see job_result.h).
#include "server/job_result.h"

#include "absl/strings/str_cat.h"
#include "engine/common/safe_files.h"
#include "nlohmann/json.hpp"

namespace megatrain::server {

absl::Status WriteJobResult(const std::string& job_id, const service::ValidatedJob& job,
                            const engine::TrainingRunResult& result, bool text_data) {
  if (job.output_dir.empty()) return absl::OkStatus();
  if (absl::Status s = engine::MakeDirectories(job.output_dir); !s.ok()) {
    return absl::PermissionDeniedError(absl::StrCat("output_dir: ", s.message()));
  }
  nlohmann::json summary = {
      {"job_id", job_id},
      {"parameters", result.parameters},
      {"steps", job.options.steps},
      {"initial_validation_loss", result.initial_validation_loss},
      {"final_validation_loss", result.final_validation_loss},
      {"final_train_loss", result.final_train_loss},
      {"median_tokens_per_second", result.tokens_per_second},
      {"resumed_from_step", result.resumed_from_step},
      {"last_checkpoint", result.last_checkpoint},
  };
  if (job.options.trainer.speculative_update) {
    summary["speculative_update"] = {{"committed_steps", result.speculations_committed},
                                     {"discarded_steps", result.speculations_discarded}};
  }
  // Computed for text only (engine::RunDataIsText): a token file carries no corpus and a sample
  // set's loss counts only masked targets, so there a 0 would read as a measured entropy.
  if (text_data) summary["unigram_entropy_nats"] = result.unigram_entropy_nats;
  if (!job.hosts.empty()) summary["ranks"] = job.ranks;
  // Never through a symlink planted in the output directory (issue 16, point 1).
  if (absl::Status s =
          engine::WriteFileInDirectory(job.output_dir, "result.json", summary.dump(2) + "\n");
      !s.ok()) {
    return absl::PermissionDeniedError(absl::StrCat("output_dir: result.json: ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace megatrain::server
