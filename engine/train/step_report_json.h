// The JSON form of a StepReport and a TrainingRunResult: how a worker process (an MPI rank) hands
// its steps and its run's result to the daemon over a pipe, one JSON line each.
#pragma once

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "engine/train/step_report.h"
#include "engine/train/training_run.h"

namespace megatrain::engine {

// Lossless: every field under its C++ name, finite doubles bit-exact through dump() and parse(),
// NaN and infinities as the strings "nan", "inf" and "-inf" (JSON numbers cannot hold them; a
// skipped step's loss or norm can be one), 64-bit integers whole.
nlohmann::json StepReportToJson(const StepReport& report);
// Absent keys keep the struct's defaults, so a report from an older writer still parses; a key of
// the wrong type is INVALID_ARGUMENT naming it. Never throws.
absl::StatusOr<StepReport> StepReportFromJson(const nlohmann::json& value);

// The same rules for a run's result (its losses may be NaN too) and for one number.
nlohmann::json TrainingRunResultToJson(const TrainingRunResult& result);
absl::StatusOr<TrainingRunResult> TrainingRunResultFromJson(const nlohmann::json& value);
nlohmann::json NumberToJson(double value);
absl::StatusOr<double> NumberFromJson(const nlohmann::json& value);

}  // namespace megatrain::engine
