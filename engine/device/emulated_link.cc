// EmulatedLink: memcpy, then hold the link until the emulated transfer time has passed.
#include "engine/device/emulated_link.h"

#include <cstring>
#include <thread>

namespace megatrain::engine {

EmulatedLink::EmulatedLink(double gbps, double latency_us) : gbps_(gbps), latency_us_(latency_us) {}

std::chrono::nanoseconds EmulatedLink::MinimumDuration(size_t bytes) const {
  double ns = latency_us_ * 1e3;
  const double gbps = this->gbps();
  if (gbps > 0) ns += static_cast<double>(bytes) / gbps;  // bytes / (gbps * 1e9) s, in ns
  return std::chrono::nanoseconds(static_cast<int64_t>(ns));
}

void EmulatedLink::Copy(void* dst, const void* src, size_t bytes) {
  if (!throttled()) {
    if (bytes > 0) std::memcpy(dst, src, bytes);
    return;
  }
  std::lock_guard<std::mutex> hold(busy_);
  const auto deadline = std::chrono::steady_clock::now() + MinimumDuration(bytes);
  if (bytes > 0) std::memcpy(dst, src, bytes);
  std::this_thread::sleep_until(deadline);
}

}  // namespace megatrain::engine
