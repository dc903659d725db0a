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

absl::Status TextJobEngine::Run(const std::string& job_id, const ValidatedJob& job,
                                engine::TrainingObserver& observer) {
  absl::StatusOr<engine::TextTrainingResult> result =
      engine::TrainOnText(job.model, job.options, observer);
  if (!result.ok()) return result.status();
  if (job.output_dir.empty()) return absl::OkStatus();
  std::error_code ec;
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
  };
  const std::string path = job.output_dir + "/result.json";
  std::ofstream out(path);
  out << summary.dump(2) << "\n";
  if (!out)
    return absl::PermissionDeniedError(absl::StrCat("output_dir: cannot write '", path, "'"));
  return absl::OkStatus();
}

}  // namespace megatrain::server
