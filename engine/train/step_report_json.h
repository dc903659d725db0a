// The JSON form of a StepReport and an EvalReplyReport: how a worker process (an MPI rank) hands
// its steps and eval replies to the daemon over a pipe, one JSON line each.
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

// The same rules for an eval reply.
nlohmann::json EvalReplyToJson(const EvalReplyReport& reply);
absl::StatusOr<EvalReplyReport> EvalReplyFromJson(const nlohmann::json& value);

}  // namespace megatrain::engine
