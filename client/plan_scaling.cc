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
  // The host memory the profile's machine needs per node (store + the executor's pinned staging).
  const uint64_t host_bytes = s->plan.placement.pinned_used + s->plan.placement.ram_used +
                              s->plan.pinned_reserved;
  if (json) {
    nlohmann::json j;
    j["hardware"] = s->hardware.name;
    j["one_device"] = {
        {"parameters", s->plan.parameters},  {"tokens_per_step", s->plan.tokens_per_step},
        {"step_seconds", t.step_seconds},    {"tokens_per_second", t.tokens_per_second},
        {"model_tflops", t.model_tflops},    {"bottleneck", t.bottleneck},
        {"fits_device", s->plan.fits_device}, {"host_bytes", host_bytes}};
    j["data_parallel"] = nlohmann::json::parse(engine::planner::ScalingJson(s->rows));
    return j.dump(2) + "\n";
  }
  std::string out = absl::StrFormat(
      "hardware %s: %s\n"
      "one device: %d parameters, %.0f tokens/step, step %.3f s, %.0f tokens/s, %.1f model "
      "TFLOP/s, bottleneck %s%s\n"
      "host memory per node: %.2f GiB (the store and pinned staging; not checked against this "
      "machine)\n\n",
      s->hardware.name, s->hardware.description, s->plan.parameters, s->plan.tokens_per_step,
      t.step_seconds, t.tokens_per_second, t.model_tflops, t.bottleneck,
      s->plan.fits_device ? "" : " (DOES NOT FIT the device)",
      static_cast<double>(host_bytes) / (1ull << 30));
  return out + engine::planner::ScalingTable(s->rows) +
         "(predictions of the planner, docs/planning.md \"Data parallelism\"; not measured)\n";
}

}  // namespace megatrain::client
