// PlanOffline (see offline_plan.h).
#include "service/offline_plan.h"

#include "absl/strings/str_cat.h"
#include "service/daemon_config.h"
#include "service/job_spec_validation.h"
#include "service/path_policy.h"

namespace megatrain::service {

absl::StatusOr<v1::PlanResponse> PlanOffline(const v1::JobSpec& spec,
                                             const std::string& daemon_config_path) {
  v1::DaemonConfig config;
  if (daemon_config_path.empty()) {
    config.set_config_version(kDaemonConfigVersion);
    config.add_data_roots("/");
    config.add_output_roots("/");
  } else {
    absl::StatusOr<v1::DaemonConfig> loaded = LoadDaemonConfigFile(daemon_config_path);
    if (!loaded.ok()) return loaded.status();
    config = *std::move(loaded);
  }
  // Only the planning fields matter here; the listener fields need a value to validate.
  if (config.state_dir().empty()) config.set_state_dir("/nonexistent/megatrain-offline-plan");
  if (config.socket_path().empty()) config.set_socket_path("/nonexistent/megatraind.sock");
  absl::StatusOr<DaemonSettings> settings = ValidateDaemonConfig(config);
  if (!settings.ok()) {
    return absl::Status(settings.status().code(),
                        absl::StrCat("daemon config: ", settings.status().message()));
  }
  const PathPolicy paths(settings->data_roots, settings->output_roots);
  absl::StatusOr<ValidatedJob> job = ValidateJobSpec(spec, *settings, paths);
  if (!job.ok()) return job.status();
  return job->plan;
}

}  // namespace megatrain::service
