// BuildDaemonStatus (see daemon_status.h).
#include "server/daemon_status.h"

#include "engine/device/device_options.h"

namespace megatrain::server {

v1::DaemonStatus BuildDaemonStatus(const service::DaemonSettings& settings, const JobRunner& runner,
                                   const std::string& public_key_hex) {
  v1::DaemonStatus response;
  const RunnerStatus status = runner.Status();
  response.set_version(kDaemonVersion);
  response.set_device(std::string(engine::DeviceKindName(settings.device.kind)));
  response.set_healthy(status.healthy);
  response.set_unhealthy_reason(status.unhealthy_reason);
  response.set_queue_length(static_cast<uint32_t>(status.queued));
  response.set_running_job_id(status.running_job_id);
  response.set_public_key(public_key_hex);
  v1::TierUsage* device = response.add_memory();
  device->set_tier("device");
  device->set_budget_bytes(settings.device.arena_bytes);
  v1::TierUsage* pinned = response.add_memory();
  pinned->set_tier("pinned");
  pinned->set_budget_bytes(settings.device.pinned_budget_bytes);
  if (!status.running_job_id.empty()) {
    if (absl::StatusOr<v1::Job> job = runner.Get(status.running_job_id); job.ok()) {
      for (const v1::TierUsage& t : job->progress().memory()) {
        if (t.tier() == "device") device->set_bytes(t.bytes());
        if (t.tier() == "pinned") pinned->set_bytes(t.bytes());
      }
    }
  }
  for (size_t d = 0; d < status.devices.size(); ++d) {
    const DeviceState& state = status.devices[d];
    v1::DeviceStatus* device_status = response.add_devices();
    device_status->set_index(static_cast<uint32_t>(d));
    device_status->set_name(state.name);
    device_status->set_arena_capacity_bytes(state.arena.capacity);
    device_status->set_arena_in_use_bytes(state.arena.in_use);
    device_status->set_healthy(state.health.ok());
    device_status->set_unhealthy_reason(std::string(state.health.message()));
  }
  return response;
}

}  // namespace megatrain::server
