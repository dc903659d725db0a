// PlanOffline and PlanScalingOffline (see offline_plan.h).
#include "service/offline_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "service/daemon_config.h"
#include "service/job_spec_validation.h"
#include "service/memory_spec_validation.h"
#include "service/path_policy.h"

namespace megatrain::service {
namespace {

absl::StatusOr<DaemonSettings> OfflineSettings(const std::string& daemon_config_path) {
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
  // Without the daemon's config there are no allowed_hosts to hold a spec's hosts to; a plan
  // launches nothing.
  settings->any_host = daemon_config_path.empty();
  return settings;
}

}  // namespace

absl::StatusOr<v1::PlanResponse> PlanOffline(const v1::JobSpec& spec,
                                             const std::string& daemon_config_path) {
  absl::StatusOr<DaemonSettings> settings = OfflineSettings(daemon_config_path);
  if (!settings.ok()) return settings.status();
  const PathPolicy paths(settings->data_roots, settings->output_roots);
  absl::StatusOr<ValidatedJob> job = ValidateJobSpec(spec, *settings, paths);
  if (!job.ok()) return job.status();
  return job->plan;
}

absl::StatusOr<OfflineScaling> PlanScalingOffline(const v1::JobSpec& spec,
                                                  const std::string& daemon_config_path,
                                                  const std::string& hardware) {
  namespace planner = engine::planner;
  absl::StatusOr<planner::HardwareProfile> hw =
      planner::FindHardwareProfile(planner::BuiltinHardwareProfiles(), hardware);
  if (!hw.ok()) return hw.status();
  absl::StatusOr<DaemonSettings> settings = OfflineSettings(daemon_config_path);
  if (!settings.ok()) return settings.status();
  // The job runs on the profile's machine, not this one: a 7B plan for an H100 box must not be
  // refused for this laptop's RAM or the daemon's arena (the output says how much host memory it
  // needs, and whether it fits the profile's device).
  settings->plan_for_other_machine = true;
  v1::JobSpec one_device = spec;
  one_device.clear_devices();
  const PathPolicy paths(settings->data_roots, settings->output_roots);
  absl::StatusOr<ValidatedJob> job = ValidateJobSpec(one_device, *settings, paths);
  if (!job.ok()) return job.status();
  planner::PlanInputs in = PlanInputsFor(*job, *settings);
  // PredictScaling shards and divides one unsharded process's plan itself.
  in.ranks = 1;
  in.zero1_world = 0;
  // The profile's device and host, not the daemon's: its arena unless the spec sets one, and the
  // spec's budgets only where it gives them (the daemon's defaults describe its own machine).
  in.device_arena_bytes = spec.memory().device_arena_bytes();
  if (spec.memory().ram_bytes() == 0 && spec.memory().nvme_dir().empty()) {
    in.budgets_enabled = false;
  }
  OfflineScaling out;
  out.hardware = *hw;
  absl::StatusOr<planner::PlanResult> plan = planner::Plan(job->model, in, *hw);
  if (!plan.ok()) return plan.status();
  out.plan = *std::move(plan);
  std::vector<planner::DataParallelShape> shapes = planner::DefaultScalingShapes(*hw);
  const int devices = static_cast<int>(std::max<uint32_t>(1, spec.devices()));
  if (std::none_of(shapes.begin(), shapes.end(), [&](const planner::DataParallelShape& s) {
        return s.nodes == 1 && s.devices_per_node == devices;
      })) {
    shapes.push_back({devices, 1});
  }
  absl::StatusOr<std::vector<planner::DataParallelPrediction>> rows =
      planner::PredictScaling(out.plan, *hw, shapes);
  if (!rows.ok()) return rows.status();
  out.rows = *std::move(rows);
  return out;
}

}  // namespace megatrain::service
