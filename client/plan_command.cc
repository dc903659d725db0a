// `megatrain plan` in-process and its drive-wear flags (see plan_command.h).
#include "client/plan_command.h"

#include <cstdint>
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/cli_flags.h"
#include "client/cli_output.h"
#include "client/exit_codes.h"
#include "client/plan_scaling.h"
#include "client/plan_wear.h"
#include "client/render.h"
#include "client/spec_from_flags.h"
#include "service/offline_plan.h"

namespace megatrain::client {

// --nvme_rated_tbw: judge the plan's NVMe writes against the drive given here.
absl::Status ApplyWearFlags(const v1::JobSpec& spec, v1::PlanResponse& plan) {
  const double tbw = absl::GetFlag(FLAGS_nvme_rated_tbw);
  const double share = absl::GetFlag(FLAGS_nvme_wear_warn_share);
  if (tbw < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--nvme_rated_tbw=", tbw, " is negative"));
  }
  if (tbw == 0) {
    if (share != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--nvme_wear_warn_share=", share, " needs --nvme_rated_tbw"));
    }
    return absl::OkStatus();
  }
  engine::planner::DriveWearLimit limit;
  limit.rated_tbw_bytes = static_cast<uint64_t>(tbw * 1e12);
  if (share != 0) limit.warn_share = share;
  return client::ApplyDriveWearLimit(spec, limit, plan);
}

// `plan` without a daemon: the daemon's validation and the engine planner, in-process.
int PlanInProcess(const std::string& why) {
  absl::StatusOr<v1::JobSpec> spec = SpecFromFlags();
  if (!spec.ok()) {
    std::fprintf(stderr, "megatrain: %s\n", std::string(spec.status().message()).c_str());
    return kExitUsage;
  }
  absl::StatusOr<v1::PlanResponse> plan =
      service::PlanOffline(*spec, absl::GetFlag(FLAGS_daemon_config));
  if (!plan.ok()) {
    return ExitFor(grpc::Status(static_cast<grpc::StatusCode>(plan.status().code()),
                                std::string(plan.status().message())));
  }
  if (absl::Status s = ApplyWearFlags(*spec, *plan); !s.ok()) {
    std::fprintf(stderr, "megatrain: %s\n", std::string(s.message()).c_str());
    return kExitUsage;
  }
  const std::string note = "planned in-process by the engine planner (" + why + ")";
  if (absl::GetFlag(FLAGS_json)) {
    std::fprintf(stderr, "megatrain: %s\n", note.c_str());
    Print(client::ToJson(*plan));
  } else {
    Print(note + "\n" + client::PlanText(*plan));
  }
  return kExitOk;
}

// `plan --scaling`: the job on a hardware profile and its data-parallel scaling, in-process.
int PlanScaling() {
  absl::StatusOr<v1::JobSpec> spec = SpecFromFlags();
  if (!spec.ok()) {
    std::fprintf(stderr, "megatrain: %s\n", std::string(spec.status().message()).c_str());
    return kExitUsage;
  }
  absl::StatusOr<std::string> text =
      client::PlanScalingText(*spec, absl::GetFlag(FLAGS_daemon_config),
                              absl::GetFlag(FLAGS_hardware), absl::GetFlag(FLAGS_json));
  if (!text.ok()) {
    return ExitFor(grpc::Status(static_cast<grpc::StatusCode>(text.status().code()),
                                std::string(text.status().message())));
  }
  Print(*text);
  return kExitOk;
}

}  // namespace megatrain::client
