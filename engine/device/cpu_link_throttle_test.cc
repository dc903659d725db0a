// Tests for the CPU device's emulated link: copy time >= latency + bytes/bandwidth, same-direction
// copies share a direction's bandwidth, opposite directions do not interfere (full duplex).
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/device/cpu_device.h"
#include "engine/device/device_test_util.h"
#include "gtest/gtest.h"

namespace megatrain::engine {
namespace {

using ::megatrain::engine::testing::SynchronizeWithin;
using Clock = std::chrono::steady_clock;

constexpr size_t kCopyBytes = 64ull << 20;  // 64 MiB
constexpr double kGbps = 2.0;
// 64 MiB at 2e9 bytes/s.
constexpr double kOneCopyMs = static_cast<double>(kCopyBytes) / (kGbps * 1e9) * 1e3;  // 33.55

double MillisecondsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

class LinkThrottleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DeviceOptions options;
    options.arena_bytes = 2 * kCopyBytes;
    options.link_gbps = kGbps;
    options.link_latency_us = 50;
    absl::StatusOr<std::unique_ptr<CpuDevice>> device = CpuDevice::Create(options);
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = std::move(*device);
    first_ = *device_->CreateStream("first");
    second_ = *device_->CreateStream("second");
    slot_a_ = *device_->Allocate(kCopyBytes, "a");
    slot_b_ = *device_->Allocate(kCopyBytes, "b");
    host_a_.assign(kCopyBytes, 0x5a);
    host_b_.assign(kCopyBytes, 0);
  }
  void TearDown() override {
    slot_a_.Reset();
    slot_b_.Reset();
  }

  // Runs both streams to completion and returns the wall time in milliseconds.
  double FinishBoth(Clock::time_point start) {
    EXPECT_TRUE(SynchronizeWithin(*first_).ok());
    EXPECT_TRUE(SynchronizeWithin(*second_).ok());
    return MillisecondsSince(start);
  }

  std::unique_ptr<CpuDevice> device_;
  std::unique_ptr<Stream> first_, second_;
  DeviceBuffer slot_a_, slot_b_;
  std::vector<uint8_t> host_a_, host_b_;
};

TEST_F(LinkThrottleTest, OneCopyTakesAtLeastLatencyPlusBytesOverBandwidth) {
  const Clock::time_point start = Clock::now();
  first_->CopyHostToDevice(slot_a_.data(), host_a_.data(), kCopyBytes);
  const double elapsed = FinishBoth(start);
  EXPECT_GE(elapsed, kOneCopyMs + 0.05);
  EXPECT_LT(elapsed, 20 * kOneCopyMs);  // generous: the machine may be busy
  first_->CopyDeviceToHost(host_b_.data(), slot_a_.data(), kCopyBytes);
  ASSERT_TRUE(SynchronizeWithin(*first_).ok());
  EXPECT_EQ(std::memcmp(host_b_.data(), host_a_.data(), kCopyBytes), 0);
}

TEST_F(LinkThrottleTest, SameDirectionCopiesShareTheLinkOppositeDirectionsDoNot) {
  Clock::time_point start = Clock::now();
  first_->CopyHostToDevice(slot_a_.data(), host_a_.data(), kCopyBytes);
  second_->CopyHostToDevice(slot_b_.data(), host_a_.data(), kCopyBytes);
  const double same_direction = FinishBoth(start);

  start = Clock::now();
  first_->CopyHostToDevice(slot_a_.data(), host_a_.data(), kCopyBytes);
  second_->CopyDeviceToHost(host_b_.data(), slot_b_.data(), kCopyBytes);
  const double opposite_directions = FinishBoth(start);

  RecordProperty("same_direction_ms", std::to_string(same_direction));
  RecordProperty("opposite_directions_ms", std::to_string(opposite_directions));
  EXPECT_GE(same_direction, 2 * kOneCopyMs);  // serialised on the host->device link
  EXPECT_GE(opposite_directions, kOneCopyMs);
  EXPECT_LT(opposite_directions, same_direction);  // ~1x against ~2x
  EXPECT_EQ(host_b_[kCopyBytes - 1], 0x5a);
}

TEST_F(LinkThrottleTest, DeviceToDeviceCopiesAreNotThrottled) {
  // Not a timing bound on memcpy (the machine may be busy): only that no link time is charged,
  // checked by the link model itself.
  EmulatedLink link(kGbps, 50);
  EXPECT_EQ(link.MinimumDuration(kCopyBytes).count(),
            static_cast<int64_t>(50e3 + static_cast<double>(kCopyBytes) / kGbps));
  EmulatedLink unthrottled(0, 0);
  EXPECT_FALSE(unthrottled.throttled());
  EXPECT_EQ(unthrottled.MinimumDuration(kCopyBytes).count(), 0);
  second_->CopyDeviceToDevice(slot_b_.data(), slot_a_.data(), 1001);
  EXPECT_TRUE(SynchronizeWithin(*second_).ok());
}

}  // namespace
}  // namespace megatrain::engine
