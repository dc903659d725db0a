// CreateDevice: builds the device DeviceOptions::kind names (cpu or cuda).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/device/device.h"

namespace megatrain::engine {

// cuda without a usable GPU is FAILED_PRECONDITION "no CUDA device: ..."; callers that want the
// CPU device then must ask for it (there is no silent fallback).
absl::StatusOr<std::unique_ptr<Device>> CreateDevice(const DeviceOptions& options);

}  // namespace megatrain::engine
