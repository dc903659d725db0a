// Streaming safetensors writer.
#include "engine/checkpoint/safetensors_stream_writer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace megatrain::engine {

absl::StatusOr<SafetensorsStreamWriter> SafetensorsStreamWriter::Create(
    const std::string& path, std::vector<SafetensorsEntry> entries,
    const std::map<std::string, std::string>& metadata, bool with_digests) {
  uint64_t data_bytes = 0;
  absl::StatusOr<std::string> header = EncodeSafetensorsHeader(entries, metadata, &data_bytes);
  if (!header.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", header.status().message()));
  }
  absl::StatusOr<DurableFileWriter> file = DurableFileWriter::Create(path, with_digests);
  if (!file.ok()) return file.status();
  if (absl::Status s = file->Append(*header); !s.ok()) return s;
  SafetensorsStreamWriter writer(std::move(*file), data_bytes);
  if (with_digests) {
    const uint64_t data_start = header->size();
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
