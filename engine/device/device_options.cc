// DeviceOptions validation and DeviceKind names.
#include "engine/device/device_options.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace megatrain::engine {

std::string_view DeviceKindName(DeviceKind kind) {
  return kind == DeviceKind::kCuda ? "cuda" : "cpu";
}

absl::StatusOr<DeviceKind> ParseDeviceKind(std::string_view name) {
  if (name == "cpu") return DeviceKind::kCpu;
  if (name == "cuda") return DeviceKind::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("device kind must be \"cpu\" or \"cuda\", got \"", std::string(name), "\""));
}

absl::Status ValidateDeviceOptions(const DeviceOptions& options) {
  if (options.arena_bytes == 0) {
    return absl::InvalidArgumentError("arena_bytes must be > 0, got 0");
  }
  if (!std::isfinite(options.link_gbps) || options.link_gbps < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "link_gbps must be finite and >= 0 (0 = unthrottled), got ", options.link_gbps));
  }
  if (!std::isfinite(options.link_latency_us) || options.link_latency_us < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("link_latency_us must be finite and >= 0, got ", options.link_latency_us));
  }
  if (options.cuda_device_ordinal < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda_device_ordinal must be >= 0, got ", options.cuda_device_ordinal));
  }
  return absl::OkStatus();
}

}  // namespace megatrain::engine
