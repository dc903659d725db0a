// PlanScalingText (see plan_scaling.h).
#include "client/plan_scaling.h"

#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "service/offline_plan.h"

namespace megatrain::client {

absl::StatusOr<std::string> PlanScalingText(const v1::JobSpec& spec,
                                            const std::string& daemon_config_path,
                                            const std::string& hardware, bool json) {
  absl::StatusOr<service::OfflineScaling> s =
      service::PlanScalingOffline(spec, daemon_config_path, hardware);
  if (!s.ok()) return s.status();
  const engine::planner::StepTimeEstimate& t = s->plan.time;
  // The host memory the profile's machine needs: the one store, plus each device's executor
  // staging (pinned) on a node of several devices.
  const uint64_t store_bytes = s->plan.placement.pinned_used + s->plan.placement.ram_used;
  const uint64_t staging_bytes = s->plan.pinned_reserved;
  const uint64_t host_bytes = store_bytes + staging_bytes;
  constexpr double kGiB = 1ull << 30;
  if (json) {
    nlohmann::json j;
    j["hardware"] = s->hardware.name;
    j["one_device"] = {
        {"parameters", s->plan.parameters},  {"tokens_per_step", s->plan.tokens_per_step},
        {"step_seconds", t.step_seconds},    {"tokens_per_second", t.tokens_per_second},
        {"model_tflops", t.model_tflops},    {"bottleneck", t.bottleneck},
        {"fits_device", s->plan.fits_device},  {"host_bytes", host_bytes},
        {"host_store_bytes", store_bytes},      {"host_staging_bytes_per_device", staging_bytes}};
    j["data_parallel"] = nlohmann::json::parse(engine::planner::ScalingJson(s->rows));
    return j.dump(2) + "\n";
  }
  std::string out = absl::StrFormat(
      "hardware %s: %s\n"
      "one device: %d parameters, %.0f tokens/step, step %.3f s, %.0f tokens/s, %.1f model "
      "TFLOP/s, bottleneck %s%s\n"
      "host memory: %.2f GiB with one device (store %.2f GiB + pinned staging %.2f GiB per "
      "device); not checked against this machine\n\n",
      s->hardware.name, s->hardware.description, s->plan.parameters, s->plan.tokens_per_step,
      t.step_seconds, t.tokens_per_second, t.model_tflops, t.bottleneck,
      s->plan.fits_device ? "" : " (DOES NOT FIT the device)",
      host_bytes / kGiB, store_bytes / kGiB, staging_bytes / kGiB);
  return out + engine::planner::ScalingTable(s->rows) +
         "(predictions of the planner, docs/planning.md \"Data parallelism\"; not measured)\n";
}

}  // namespace megatrain::client
