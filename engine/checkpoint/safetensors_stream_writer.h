// SafetensorsStreamWriter: writes a .safetensors file tensor by tensor from
// caller-owned buffers, so a checkpoint never holds a second copy of the model.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/checkpoint/durable_file.h"
#include "engine/model/safetensors_dtype.h"
#include "engine/model/safetensors_writer.h"
#include "engine/provenance/record.h"
#include "engine/provenance/sha256.h"

namespace megatrain::engine {

// The header (EncodeSafetensorsHeader, engine/model/safetensors_writer.h) is
// written at creation; then each
// tensor's bytes must be appended, in order, exactly once. Finish() refuses an
// incomplete file and fsyncs it. With `with_digests`, the SHA-256 of the file
// and of each tensor's bytes are computed while streaming.
class SafetensorsStreamWriter {
 public:
  static absl::StatusOr<SafetensorsStreamWriter> Create(
      const std::string& path, std::vector<SafetensorsEntry> entries,
      const std::map<std::string, std::string>& metadata = {}, bool with_digests = false);

  // The next tensor's bytes; may be given in several pieces.
  absl::Status Append(absl::Span<const uint8_t> bytes);
  absl::Status Append(absl::Span<const float> values) {
    return Append(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(values.data()),
                                      values.size() * sizeof(float)));
  }
  absl::Status Finish();

  FileChecksum checksum() const { return file_.checksum(); }
  const std::string& path() const { return file_.path(); }
  // After Finish, with digests: the file's and each tensor's SHA-256 (the
  // file name is the path's last component).
  provenance::FileDigest digest() const;

 private:
  SafetensorsStreamWriter(DurableFileWriter file, uint64_t data_bytes)
      : file_(std::move(file)), data_bytes_(data_bytes) {}
  DurableFileWriter file_;
  uint64_t data_bytes_ = 0;
  uint64_t written_ = 0;
  // With digests: every tensor's range (sha256_hex filled as each completes).
  std::vector<provenance::TensorDigest> tensors_;
  size_t current_tensor_ = 0;
  std::optional<provenance::Sha256> tensor_sha_;
};

}  // namespace megatrain::engine
