// Tests for CreateDevice and DeviceOptions parsing/validation.
#include "engine/device/device_factory.h"

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::engine {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(DeviceFactoryTest, CreatesTheCpuDevice) {
  DeviceOptions options;
  options.arena_bytes = 1 << 16;
  absl::StatusOr<std::unique_ptr<Device>> device = CreateDevice(options);
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_EQ((*device)->kind(), DeviceKind::kCpu);
  EXPECT_EQ((*device)->arena_stats().capacity, 1u << 16);
  EXPECT_TRUE((*device)->health().ok());
}

TEST(DeviceFactoryTest, CudaWithoutAGpuSaysSoAndDoesNotFallBack) {
  DeviceOptions options;
  options.kind = DeviceKind::kCuda;
  options.arena_bytes = 1 << 16;
  absl::StatusOr<std::unique_ptr<Device>> device = CreateDevice(options);
  if (device.ok()) {
    EXPECT_EQ((*device)->kind(), DeviceKind::kCuda);
    return;
  }
  EXPECT_EQ(device.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(device.status().message()), StartsWith("no CUDA device: "));
}

TEST(DeviceOptionsTest, ParsesKindsAndRejectsOthersNamingTheValue) {
  EXPECT_EQ(*ParseDeviceKind("cpu"), DeviceKind::kCpu);
  EXPECT_EQ(*ParseDeviceKind("cuda"), DeviceKind::kCuda);
  EXPECT_THAT(ParseDeviceKind("tpu").status().ToString(), HasSubstr("\"tpu\""));
  EXPECT_EQ(DeviceKindName(DeviceKind::kCuda), "cuda");
}

TEST(DeviceOptionsTest, ValidationNamesFieldAndValue) {
  DeviceOptions options;
  options.arena_bytes = 4096;
  EXPECT_TRUE(ValidateDeviceOptions(options).ok());
  options.link_latency_us = -3;
  EXPECT_THAT(ValidateDeviceOptions(options).ToString(), HasSubstr("link_latency_us"));
  EXPECT_THAT(ValidateDeviceOptions(options).ToString(), HasSubstr("-3"));
  options.link_latency_us = 0;
  options.cuda_device_ordinal = -1;
  EXPECT_THAT(ValidateDeviceOptions(options).ToString(), HasSubstr("cuda_device_ordinal"));
}

}  // namespace
}  // namespace megatrain::engine
