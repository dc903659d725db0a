// WriteSafetensors: writes tensors to a .safetensors file atomically (tmp, fsync, rename).
#include "engine/model/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/common/file_io.h"
#include "engine/common/unique_fd.h"

namespace megatrain::engine {
namespace {

std::vector<SafetensorsEntry> EntriesOf(const std::vector<TensorToWrite>& tensors) {
  std::vector<SafetensorsEntry> entries;
  entries.reserve(tensors.size());
  for (const TensorToWrite& t : tensors) entries.push_back({t.name, t.dtype, t.shape});
  return entries;
}

// The header of `tensors`, after checking that each one's data matches its shape x dtype.
absl::StatusOr<std::string> BuildHeader(const std::vector<TensorToWrite>& tensors,
                                        const std::map<std::string, std::string>& metadata) {
  absl::StatusOr<std::string> header = EncodeSafetensorsHeader(EntriesOf(tensors), metadata);
  if (!header.ok()) return header.status();
  for (const TensorToWrite& t : tensors) {
    const uint64_t bytes = *SafetensorsEntryBytes({t.name, t.dtype, t.shape});
    if (bytes != t.data.size()) {
      const uint64_t item = SafetensorsDtypeSize(t.dtype);
      return absl::InvalidArgumentError(absl::StrCat(
          "safetensors: tensor '", t.name, "' has ", t.data.size(), " bytes; its shape of ",
          std::string(SafetensorsDtypeName(t.dtype)), " needs ", bytes / item, " x ", item));
    }
  }
  return header;
}

}  // namespace

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

absl::StatusOr<std::string> EncodeSafetensorsHeader(
    const std::vector<SafetensorsEntry>& entries,
    const std::map<std::string, std::string>& metadata, uint64_t* data_bytes) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  std::set<std::string_view> names;
  uint64_t offset = 0;
  for (const SafetensorsEntry& e : entries) {
    if (e.name == "__metadata__") {
      return absl::InvalidArgumentError("safetensors: tensor name '__metadata__' is reserved");
    }
    if (!names.insert(e.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: duplicate tensor name '", e.name, "'"));
    }
    absl::StatusOr<uint64_t> bytes = SafetensorsEntryBytes(e);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: ", bytes.status().message()));
    }
    header[e.name] = {{"dtype", std::string(SafetensorsDtypeName(e.dtype))},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + *bytes}}};
    offset += *bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  if (data_bytes != nullptr) *data_bytes = offset;
  return out + text;
}

absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<TensorToWrite>& tensors, const std::map<std::string, std::string>& metadata) {
  auto header = BuildHeader(tensors, metadata);
  if (!header.ok()) return header.status();
  std::string out = std::move(*header);
  for (const TensorToWrite& t : tensors) {
    out.append(reinterpret_cast<const char*>(t.data.data()), t.data.size());
  }
  return out;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  auto header = BuildHeader(tensors, metadata);
  if (!header.ok()) return header.status();
  const std::string tmp = path + ".tmp";
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat(tmp, ": open"));
  absl::Status status = WriteAll(fd.get(), *header, tmp);
  for (size_t i = 0; status.ok() && i < tensors.size(); ++i) {
    status = WriteAll(fd.get(), tensors[i].data, tmp);
  }
  if (status.ok() && ::fsync(fd.get()) != 0) {
    status = ErrnoStatus(errno, absl::StrCat(tmp, ": fsync"));
  }
  if (::close(fd.Release()) != 0 && status.ok()) {
    status = ErrnoStatus(errno, absl::StrCat(tmp, ": close"));
  }
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    status = ErrnoStatus(errno, absl::StrCat("rename ", tmp, " -> ", path));
  }
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return status;
  }
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  const UniqueFd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir_fd.valid()) return ErrnoStatus(errno, absl::StrCat(dir, ": open directory"));
  if (::fsync(dir_fd.get()) != 0) return ErrnoStatus(errno, absl::StrCat(dir, ": fsync directory"));
  return absl::OkStatus();
}

}  // namespace megatrain::engine
