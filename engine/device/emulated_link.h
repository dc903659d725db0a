// EmulatedLink: one direction of a throttled host<->device link on the CPU device.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <mutex>

namespace megatrain::engine {

// A copy of b bytes takes at least latency + b / bandwidth: the memcpy runs at full speed, then
// the copy waits out the remainder (an emulation of transfer time, not a synchronisation).
// Copies in one direction hold the link for their whole duration, so concurrent copies from
// different streams share its bandwidth; the two directions are separate objects (full duplex).
class EmulatedLink {
 public:
  // gbps: bandwidth in 1e9 bytes/s, 0 = unthrottled; latency_us: per-copy latency.
  EmulatedLink(double gbps, double latency_us);
  EmulatedLink(const EmulatedLink&) = delete;
  EmulatedLink& operator=(const EmulatedLink&) = delete;

  void Copy(void* dst, const void* src, size_t bytes);

  // The least time a copy of `bytes` occupies the link (zero when unthrottled).
  std::chrono::nanoseconds MinimumDuration(size_t bytes) const;
  bool throttled() const { return gbps() > 0 || latency_us_ > 0; }

  // Changes the bandwidth for copies that start from now on (0 = unthrottled):
  // another process taking a share of the link, in tests and benchmarks.
  void set_gbps(double gbps) { gbps_.store(gbps, std::memory_order_relaxed); }
  double gbps() const { return gbps_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> gbps_;
  const double latency_us_;
  std::mutex busy_;
};

}  // namespace megatrain::engine
