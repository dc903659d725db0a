// CpuDeviceState: what a CpuDevice shares with its streams and events (arena range, links,
// sticky fault, timeline), held by shared_ptr so teardown order cannot crash them.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "engine/device/emulated_link.h"
#include "engine/device/timeline.h"

namespace megatrain::engine {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

class CpuDeviceState {
 public:
  CpuDeviceState(std::string name, std::unique_ptr<char, FreeDeleter> arena_memory,
                 size_t arena_bytes, double link_gbps, double link_latency_us);

  const std::string& name() const { return name_; }
  char* arena_base() const { return arena_memory_.get(); }
  // Whether [data, data + bytes) lies inside the emulated device memory.
  bool InArena(const void* data, size_t bytes) const;

  EmulatedLink& host_to_device() { return host_to_device_; }
  EmulatedLink& device_to_host() { return device_to_host_; }
  Timeline& timeline() { return timeline_; }

  // The sticky device fault (OK while healthy). The first fault wins.
  absl::Status fault() const;
  void SetFault(absl::Status fault);

 private:
  const std::string name_;
  const std::unique_ptr<char, FreeDeleter> arena_memory_;
  const size_t arena_bytes_;
  EmulatedLink host_to_device_;
  EmulatedLink device_to_host_;
  Timeline timeline_;
  mutable std::mutex fault_mu_;
  absl::Status fault_;
};

}  // namespace megatrain::engine
