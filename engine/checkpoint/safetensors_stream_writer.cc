// Streaming safetensors writer.
#include "engine/checkpoint/safetensors_stream_writer.h"

#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/str_cat.h"

namespace megatrain::engine {

absl::StatusOr<uint64_t> SafetensorsEntryBytes(const SafetensorsEntry& entry) {
  uint64_t numel = 1;
  for (int64_t dim : entry.shape) {
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", entry.name, "' has negative dimension ", dim));
    }
    if (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(dim)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", entry.name, "' shape overflows"));
    }
    numel *= static_cast<uint64_t>(dim);
  }
  const uint64_t item = SafetensorsDtypeSize(entry.dtype);
  if (numel > std::numeric_limits<uint64_t>::max() / item) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", entry.name, "' size overflows"));
  }
  return numel * item;
}

absl::StatusOr<SafetensorsStreamWriter> SafetensorsStreamWriter::Create(
    const std::string& path, std::vector<SafetensorsEntry> entries,
    const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const SafetensorsEntry& e : entries) {
    if (e.name == "__metadata__" || !names.insert(e.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor name '", e.name, "' is reserved or duplicate"));
    }
    absl::StatusOr<uint64_t> bytes = SafetensorsEntryBytes(e);
    if (!bytes.ok())
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", bytes.status().message()));
    header[e.name] = {{"dtype", std::string(SafetensorsDtypeName(e.dtype))},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + *bytes}}};
    offset += *bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string prefix(8, '\0');
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>((n >> (8 * i)) & 0xff);

  absl::StatusOr<DurableFileWriter> file = DurableFileWriter::Create(path);
  if (!file.ok()) return file.status();
  if (absl::Status s = file->Append(prefix); !s.ok()) return s;
  if (absl::Status s = file->Append(text); !s.ok()) return s;
  return SafetensorsStreamWriter(std::move(*file), offset);
}

absl::Status SafetensorsStreamWriter::Append(absl::Span<const uint8_t> bytes) {
  if (written_ + bytes.size() > data_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat(path(), ": appending ", bytes.size(), " bytes after ", written_,
                     " would exceed the header's data size of ", data_bytes_));
  }
  written_ += bytes.size();
  return file_.Append(bytes);
}

absl::Status SafetensorsStreamWriter::Finish() {
  if (written_ != data_bytes_) {
    return absl::FailedPreconditionError(
        absl::StrCat(path(), ": only ", written_, " of ", data_bytes_, " data bytes were written"));
  }
  return file_.Close();
}

}  // namespace megatrain::engine
