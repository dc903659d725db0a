// CpuDeviceState: arena bounds check and the sticky fault.
#include "engine/device/cpu_device_state.h"

#include <cstdint>
#include <utility>

namespace megatrain::engine {

CpuDeviceState::CpuDeviceState(std::string name, std::unique_ptr<char, FreeDeleter> arena_memory,
                               size_t arena_bytes, double link_gbps, double link_latency_us)
    : name_(std::move(name)),
      arena_memory_(std::move(arena_memory)),
      arena_bytes_(arena_bytes),
      host_to_device_(link_gbps, link_latency_us),
      device_to_host_(link_gbps, link_latency_us) {}

bool CpuDeviceState::InArena(const void* data, size_t bytes) const {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(arena_memory_.get());
  const uintptr_t p = reinterpret_cast<uintptr_t>(data);
  return p >= begin && bytes <= arena_bytes_ && p - begin <= arena_bytes_ - bytes;
}

absl::Status CpuDeviceState::fault() const {
  std::lock_guard<std::mutex> lock(fault_mu_);
  return fault_;
}

void CpuDeviceState::SetFault(absl::Status fault) {
  std::lock_guard<std::mutex> lock(fault_mu_);
  if (fault_.ok()) fault_ = std::move(fault);
}

}  // namespace megatrain::engine
