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

namespace megatrain::engine {
namespace {

absl::Status ErrnoError(int err, const std::string& what) {
  return absl::ErrnoToStatus(err, absl::StrCat(what, ": ", std::strerror(err)));
}

absl::Status WriteAll(int fd, const uint8_t* p, size_t n, const std::string& path) {
  while (n > 0) {
    const size_t chunk = std::min<size_t>(n, size_t{1} << 30);
    const ssize_t written = ::write(fd, p, chunk);
    if (written < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, absl::StrCat(path, ": write"));
    }
    p += written;
    n -= static_cast<size_t>(written);
  }
  return absl::OkStatus();
}

// Validates the tensors and builds the padded header.
absl::StatusOr<std::string> BuildHeader(const std::vector<TensorToWrite>& tensors,
                                        const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  std::set<std::string_view> names;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    if (t.name == "__metadata__") {
      return absl::InvalidArgumentError("safetensors: tensor name '__metadata__' is reserved");
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: duplicate tensor name '", t.name, "'"));
    }
    uint64_t numel = 1;
    for (int64_t dim : t.shape) {
      if (dim < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("safetensors: tensor '", t.name, "' has negative dimension ", dim));
      }
      if (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(dim)) {
        return absl::InvalidArgumentError(
            absl::StrCat("safetensors: tensor '", t.name, "' shape overflows"));
      }
      numel *= static_cast<uint64_t>(dim);
    }
    const uint64_t item = SafetensorsDtypeSize(t.dtype);
    if (numel > std::numeric_limits<uint64_t>::max() / item || numel * item != t.data.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "safetensors: tensor '", t.name, "' has ", t.data.size(), " bytes; its shape of ",
          std::string(SafetensorsDtypeName(t.dtype)), " needs ", numel, " x ", item));
    }
    header[t.name] = {{"dtype", std::string(SafetensorsDtypeName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + text;
}

}  // namespace

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
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, absl::StrCat(tmp, ": open"));
  auto status = WriteAll(fd, reinterpret_cast<const uint8_t*>(header->data()), header->size(), tmp);
  for (size_t i = 0; status.ok() && i < tensors.size(); ++i) {
    status = WriteAll(fd, tensors[i].data.data(), tensors[i].data.size(), tmp);
  }
  if (status.ok() && ::fsync(fd) != 0) status = ErrnoError(errno, absl::StrCat(tmp, ": fsync"));
  if (::close(fd) != 0 && status.ok()) status = ErrnoError(errno, absl::StrCat(tmp, ": close"));
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    status = ErrnoError(errno, absl::StrCat("rename ", tmp, " -> ", path));
  }
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return status;
  }
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return ErrnoError(errno, absl::StrCat(dir, ": open directory"));
  const int rc = ::fsync(dir_fd);
  const int err = errno;
  ::close(dir_fd);
  if (rc != 0) return ErrnoError(err, absl::StrCat(dir, ": fsync directory"));
  return absl::OkStatus();
}

}  // namespace megatrain::engine
