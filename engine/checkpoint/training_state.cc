// trainer_state.json serialisation.
#include "engine/checkpoint/training_state.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "engine/common/strict_json.h"

namespace megatrain::engine {

std::string TrainingStateToJson(const TrainingState& s) {
  nlohmann::json job = nlohmann::json::parse(s.job_json, nullptr, /*allow_exceptions=*/false);
  if (!job.is_object()) job = nlohmann::json{{"unparsed", s.job_json}};
  nlohmann::json j = {{"version", kTrainingStateVersion},
                      {"step", s.progress.step},
                      {"applied_updates", s.progress.applied_updates},
                      {"skipped_steps", s.progress.skipped_steps},
                      {"consecutive_skips", s.progress.consecutive_skips},
                      {"data_cursor", s.data_cursor},
                      {"seed", s.seed},
                      {"job", job}};
  // Only when a run keeps one (the previous-norm clip rule), so other runs' files, and the
  // binaries before the rule, stay as they were.
  if (s.progress.previous_grad_norm != 0) j["previous_grad_norm"] = s.progress.previous_grad_norm;
  return j.dump(2) + "\n";
}

absl::StatusOr<TrainingState> ParseTrainingState(std::string_view text, const std::string& source) {
  absl::StatusOr<nlohmann::json> parsed = ParseJsonStrict(text, source);
  if (!parsed.ok()) return parsed.status();
  const nlohmann::json& j = *parsed;
  if (!j.is_object())
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  auto version = j.find("version");
  if (version == j.end() || !version->is_number_unsigned() || *version != kTrainingStateVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": version ", version == j.end() ? "missing" : JsonForMessage(*version),
        " is not supported (this build reads version ", kTrainingStateVersion, ")"));
  }
  const char* const kCounters[] = {
      "step", "applied_updates", "skipped_steps", "consecutive_skips", "data_cursor", "seed"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool known = it.key() == "version" || it.key() == "job" || it.key() == "previous_grad_norm";
    for (const char* k : kCounters) known = known || it.key() == k;
    if (!known)
      return absl::InvalidArgumentError(absl::StrCat(source, ": unknown key \"", it.key(), "\""));
  }
  uint64_t values[6];
  for (int i = 0; i < 6; ++i) {
    auto it = j.find(kCounters[i]);
    if (it == j.end() || !it->is_number_unsigned()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": \"", kCounters[i], "\" must be a non-negative integer, got ",
                       it == j.end() ? "nothing" : JsonForMessage(*it)));
    }
    values[i] = it->get<uint64_t>();
  }
  auto job = j.find("job");
  if (job == j.end() || !job->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": \"job\" must be an object"));
  }
  TrainingState s;
  // Written since the previous-norm clip rule (2026-11-28); a checkpoint without it resumes with
  // none, so its next step is clipped exactly.
  if (auto norm = j.find("previous_grad_norm"); norm != j.end()) {
    if (!norm->is_number() || !(norm->get<double>() >= 0) || !std::isfinite(norm->get<double>())) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": \"previous_grad_norm\" must be a finite number >= 0, got ",
                       JsonForMessage(*norm)));
    }
    s.progress.previous_grad_norm = norm->get<double>();
  }
  s.progress.step = values[0];
  s.progress.applied_updates = values[1];
  s.progress.skipped_steps = values[2];
  if (values[3] > static_cast<uint64_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": consecutive_skips ", values[3], " is too large"));
  }
  s.progress.consecutive_skips = static_cast<int>(values[3]);
  s.data_cursor = values[4];
  s.seed = values[5];
  s.job_json = job->dump();
  return s;
}

}  // namespace megatrain::engine
