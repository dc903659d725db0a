// WriteSafetensors: writes tensors to a .safetensors file atomically (tmp, fsync, rename).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/model/safetensors_dtype.h"

namespace megatrain::engine {

struct TensorToWrite {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;
  absl::Span<const uint8_t> data;  // little-endian, numel * dtype size bytes
};

// Layout written: u64 LE header length, the JSON header ("__metadata__" first
// when non-empty, then tensors in the given order) padded with spaces to a
// multiple of 8 bytes as the reference implementation does, then each tensor's
// bytes back to back in the given order. The file appears at `path` only
// complete: it is written to path + ".tmp", fsynced, renamed over `path`, and
// the directory is fsynced. InvalidArgument for duplicate or reserved names,
// negative dims, or data sizes that disagree with shape x dtype.
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// The bytes WriteSafetensors would write (header and data), for tests and
// in-memory use.
absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<TensorToWrite>& tensors,
    const std::map<std::string, std::string>& metadata = {});

}  // namespace megatrain::engine
