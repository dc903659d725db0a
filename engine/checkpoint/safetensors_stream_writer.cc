// Streaming safetensors writer.
#include "engine/checkpoint/safetensors_stream_writer.h"

#include <algorithm>
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
    const std::map<std::string, std::string>& metadata, bool with_digests) {
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

  absl::StatusOr<DurableFileWriter> file = DurableFileWriter::Create(path, with_digests);
  if (!file.ok()) return file.status();
  if (absl::Status s = file->Append(prefix); !s.ok()) return s;
  if (absl::Status s = file->Append(text); !s.ok()) return s;
  SafetensorsStreamWriter writer(std::move(*file), offset);
  if (with_digests) {
    const uint64_t data_start = prefix.size() + text.size();
    for (const SafetensorsEntry& e : entries) {
      const uint64_t begin = writer.tensors_.empty() ? data_start : writer.tensors_.back().end;
      writer.tensors_.push_back({e.name, begin, begin + *SafetensorsEntryBytes(e), ""});
    }
    writer.tensor_sha_.emplace();
  }
  return writer;
}

provenance::FileDigest SafetensorsStreamWriter::digest() const {
  const size_t slash = path().rfind('/');
  return {slash == std::string::npos ? path() : path().substr(slash + 1), checksum().bytes,
          file_.sha256_hex(), tensors_};
}

absl::Status SafetensorsStreamWriter::Append(absl::Span<const uint8_t> bytes) {
  if (written_ + bytes.size() > data_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat(path(), ": appending ", bytes.size(), " bytes after ", written_,
                     " would exceed the header's data size of ", data_bytes_));
  }
  written_ += bytes.size();
  if (tensor_sha_.has_value()) {
    // Split the bytes at tensor boundaries; empty tensors complete at once.
    absl::Span<const uint8_t> rest = bytes;
    const uint64_t data_start = tensors_.empty() ? 0 : tensors_.front().begin;
    uint64_t position = data_start + written_ - bytes.size();
    while (current_tensor_ < tensors_.size()) {
      provenance::TensorDigest& t = tensors_[current_tensor_];
      const uint64_t take = std::min<uint64_t>(rest.size(), t.end - position);
      tensor_sha_->Update(rest.subspan(0, take));
      rest.remove_prefix(take);
      position += take;
      if (position < t.end) break;
      t.sha256_hex = tensor_sha_->FinalHex();
      ++current_tensor_;
    }
  }
  return file_.Append(bytes);
}

absl::Status SafetensorsStreamWriter::Finish() {
  if (written_ != data_bytes_) {
    return absl::FailedPreconditionError(
        absl::StrCat(path(), ": only ", written_, " of ", data_bytes_, " data bytes were written"));
  }
  if (tensor_sha_.has_value()) {
    // Trailing empty tensors (or all, when no byte was appended) are complete.
    for (; current_tensor_ < tensors_.size(); ++current_tensor_) {
      tensors_[current_tensor_].sha256_hex = tensor_sha_->FinalHex();
    }
  }
  return file_.Close();
}

}  // namespace megatrain::engine
