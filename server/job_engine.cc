// TextJobEngine and device-fault classification (see job_engine.h).
#include "server/job_engine.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace megatrain::server {

bool IsDeviceFault(const absl::Status& status) {
  return status.code() == absl::StatusCode::kInternal &&
         absl::StrContains(status.message(), "device fault");
}

std::string JobCheckpointDir(const std::string& state_dir, const std::string& job_id,
                             const ValidatedJob& job) {
  if (!job.output_dir.empty()) return job.output_dir + "/checkpoints";
  return absl::StrCat(state_dir, "/jobs/", job_id, "/checkpoints");
}

absl::Status TextJobEngine::Run(const std::string& job_id, const ValidatedJob& job,
                                engine::TrainingObserver& observer) {
  engine::TextTrainingOptions options = job.options;
  options.checkpoint_dir = JobCheckpointDir(state_dir_, job_id, job);
  options.resume = true;
  std::error_code ec;
  std::filesystem::create_directories(options.checkpoint_dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(absl::StrCat("checkpoint directory: cannot create '",
                                                    options.checkpoint_dir, "': ", ec.message()));
  }
  absl::StatusOr<engine::TextTrainingResult> result =
      engine::TrainOnText(job.model, options, observer);
  if (!result.ok()) return result.status();
  if (job.output_dir.empty()) return absl::OkStatus();
  std::filesystem::create_directories(job.output_dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("output_dir: cannot create '", job.output_dir, "': ", ec.message()));
  }
  nlohmann::json summary = {
      {"job_id", job_id},
      {"parameters", result->parameters},
      {"steps", job.options.steps},
      {"initial_validation_loss", result->initial_validation_loss},
      {"final_validation_loss", result->final_validation_loss},
      {"final_train_loss", result->final_train_loss},
      {"unigram_entropy_nats", result->unigram_entropy_nats},
      {"median_tokens_per_second", result->tokens_per_second},
      {"resumed_from_step", result->resumed_from_step},
      {"last_checkpoint", result->last_checkpoint},
  };
  const std::string path = job.output_dir + "/result.json";
  std::ofstream out(path);
  out << summary.dump(2) << "\n";
  if (!out)
    return absl::PermissionDeniedError(absl::StrCat("output_dir: cannot write '", path, "'"));
  return absl::OkStatus();
}

}  // namespace megatrain::server
