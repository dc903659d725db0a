// The one safetensors encoder: the validated header (EncodeSafetensorsHeader, also used by the
// checkpoint's streaming writer) and WriteSafetensors, which writes a whole file atomically.
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

// A tensor's name, dtype and shape: what the header says about it.
struct SafetensorsEntry {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;
};

// Bytes the tensor occupies (numel x dtype size); InvalidArgument on a negative
// dimension or overflow.
absl::StatusOr<uint64_t> SafetensorsEntryBytes(const SafetensorsEntry& entry);

// The header bytes for `entries` in order: u64 LE header length, the JSON
// header ("__metadata__" first when non-empty, then the tensors with their
// data offsets) padded with spaces to a multiple of 8 bytes as the reference
// implementation does. InvalidArgument ("safetensors: ...") for duplicate or
// reserved names, negative dims or overflow. `data_bytes` (if set) receives the
// total size of the tensors' bytes that follow.
absl::StatusOr<std::string> EncodeSafetensorsHeader(
    const std::vector<SafetensorsEntry>& entries,
    const std::map<std::string, std::string>& metadata, uint64_t* data_bytes = nullptr);

struct TensorToWrite {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;
  absl::Span<const uint8_t> data;  // little-endian, numel * dtype size bytes
};

// Layout written: EncodeSafetensorsHeader's header, then each tensor's bytes
// back to back in the given order. The file appears at `path` only
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
