// Drive-wear judgement of a plan under a command-line limit (see plan_wear.h).
#include "client/plan_wear.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"

namespace megatrain::client {

absl::Status ApplyDriveWearLimit(const v1::JobSpec& spec,
                                 const engine::planner::DriveWearLimit& limit,
                                 v1::PlanResponse& plan) {
  if (absl::Status s = engine::planner::ValidateDriveWearLimit(limit, "--"); !s.ok()) return s;
  std::vector<std::string> kept;
  for (const std::string& w : plan.warnings()) {
    if (!absl::StartsWith(w, "WARNING drive wear")) kept.push_back(w);
  }
  plan.clear_warnings();
  for (std::string& w : kept) plan.add_warnings(std::move(w));
  const engine::planner::DriveWear wear = engine::planner::EvaluateDriveWear(
      limit, plan.nvme_written_bytes_per_step(), spec.hyper().steps(),
      plan.predicted_step_seconds(), static_cast<int>(plan.ranks_per_machine()));
  plan.set_nvme_written_bytes_per_run(wear.written_per_run);
  if (!wear.warning.empty()) plan.add_warnings(wear.warning);
  return absl::OkStatus();
}

}  // namespace megatrain::client
