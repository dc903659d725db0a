// SafetensorsFile: a strict, bounds-checked, read-only memory map of one .safetensors file.
#include "engine/model/safetensors_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/common/file_io.h"
#include "engine/common/safe_files.h"
#include "engine/common/strict_json.h"

namespace megatrain::engine {
namespace {

using Json = nlohmann::json;

// Non-negative JSON integer that fits in size_t, or nullopt.
std::optional<uint64_t> AsSize(const Json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0)
    return static_cast<uint64_t>(v.get<int64_t>());
  return std::nullopt;
}

}  // namespace

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept { *this = std::move(other); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    Unmap();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_size_ = std::exchange(other.map_size_, 0);
    data_ = std::exchange(other.data_, nullptr);
    fd_ = std::move(other.fd_);
    data_offset_ = std::exchange(other.data_offset_, 0);
    tensors_ = std::move(other.tensors_);
    index_ = std::move(other.index_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { Unmap(); }

void SafetensorsFile::Unmap() {
  if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), map_size_);
  map_ = nullptr;
  map_size_ = 0;
  data_ = nullptr;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path,
                                                      const InputFiles* inputs) {
  if (inputs == nullptr) return Open(path);
  absl::StatusOr<UniqueFd> fd = inputs->Duplicate(path);
  if (!fd.ok()) return fd.status();
  return OpenDescriptor(*std::move(fd), path, /*map=*/false);
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::OpenUnmapped(const std::string& path) {
  absl::StatusOr<UniqueFd> fd = OpenRegularFileForRead(path);
  if (!fd.ok()) return fd.status();
  return OpenDescriptor(*std::move(fd), path, /*map=*/false);
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat(path, ": cannot open: ", std::strerror(err)));
  }
  return OpenDescriptor(std::move(fd), path, /*map=*/true);
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::OpenDescriptor(UniqueFd fd,
                                                                const std::string& path, bool map) {
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat(path, ": fstat: ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": file is ", file_size, " bytes, too short for the 8-byte header length"));
  }
  SafetensorsFile file;
  file.path_ = path;
  uint8_t length[8];
  if (map) {
    void* mapped = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
    if (mapped == MAP_FAILED) {
      const int err = errno;
      return absl::ErrnoToStatus(err, absl::StrCat(path, ": mmap: ", std::strerror(err)));
    }
    file.map_ = static_cast<const uint8_t*>(mapped);
    file.map_size_ = file_size;
    std::memcpy(length, file.map_, 8);
  } else if (absl::Status s = PreadExactly(fd.get(), 0, length, 8, path); !s.ok()) {
    return s;
  }
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | length[i];
  if (header_size > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header length ", header_size,
                                                   " exceeds the limit of ",
                                                   kMaxSafetensorsHeaderBytes, " bytes"));
  }
  if (header_size > file_size - 8) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header length ", header_size,
                                                   " runs past the end of the file (", file_size,
                                                   " bytes)"));
  }
  const size_t data_size = file_size - 8 - header_size;
  if (map) {
    const std::string_view header(reinterpret_cast<const char*>(file.map_ + 8), header_size);
    file.data_ = file.map_ + 8 + header_size;
    if (absl::Status s = file.ParseHeader(header, data_size); !s.ok()) return s;
    return file;
  }
  std::string header(header_size, '\0');
  if (absl::Status s =
          PreadExactly(fd.get(), 8, reinterpret_cast<uint8_t*>(header.data()), header_size, path);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = file.ParseHeader(header, data_size); !s.ok()) return s;
  file.fd_ = std::move(fd);
  file.data_offset_ = 8 + header_size;
  return file;
}

absl::Status SafetensorsFile::ParseHeader(std::string_view header, size_t data_size) {
  auto fail = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": ", parts...));
  };
  if (header.empty() || header.front() != '{') {
    return fail("header must be a JSON object starting with '{'");
  }
  auto parsed = ParseJsonStrict(header, absl::StrCat(path_, ": header"));
  if (!parsed.ok()) return parsed.status();
  if (!parsed->is_object()) return fail("header is not a JSON object");

  for (const auto& header_item : parsed->items()) {
    // Named references, not a structured binding: clang before 16 cannot
    // capture a binding in the lambda below (the fuzz build uses clang).
    const std::string& name = header_item.key();
    const nlohmann::json& value = header_item.value();
    if (name == "__metadata__") {
      if (!value.is_object()) return fail("__metadata__ must be an object of strings");
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string()) {
          return fail("__metadata__['", key, "'] = ", JsonForMessage(text), " is not a string");
        }
        metadata_[key] = text.get<std::string>();
      }
      continue;
    }
    auto bad = [&](auto&&... parts) {
      return fail("tensor '", std::string(name), "': ", parts...);
    };
    if (!value.is_object()) return bad("entry is not an object: ", JsonForMessage(value));
    for (const auto& [field, field_value] : value.items()) {
      if (field != "dtype" && field != "shape" && field != "data_offsets") {
        return bad("unknown field '", field, "' = ", JsonForMessage(field_value));
      }
    }
    SafetensorsTensorInfo info;
    info.name = name;

    auto dtype_it = value.find("dtype");
    if (dtype_it == value.end()) return bad("missing dtype");
    if (!dtype_it->is_string()) return bad("dtype ", JsonForMessage(*dtype_it), " is not a string");
    auto dtype = ParseSafetensorsDtype(dtype_it->get_ref<const std::string&>());
    if (!dtype.has_value()) return bad("unknown or unsupported dtype ", JsonForMessage(*dtype_it));
    info.dtype = *dtype;

    auto shape_it = value.find("shape");
    if (shape_it == value.end()) return bad("missing shape");
    if (!shape_it->is_array()) return bad("shape ", JsonForMessage(*shape_it), " is not an array");
    size_t num_elements = 1;
    for (const Json& dim : *shape_it) {
      auto n = AsSize(dim);
      if (!n.has_value() || *n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return bad("shape ", JsonForMessage(*shape_it),
                   " has an entry that is not a "
                   "non-negative integer");
      }
      info.shape.push_back(static_cast<int64_t>(*n));
      if (*n != 0 && num_elements > std::numeric_limits<size_t>::max() / *n) {
        return bad("shape ", JsonForMessage(*shape_it), " overflows the element count");
      }
      num_elements *= *n;
    }
    const size_t item = SafetensorsDtypeSize(info.dtype);
    if (num_elements > std::numeric_limits<size_t>::max() / item) {
      return bad("shape ", JsonForMessage(*shape_it), " overflows the byte count");
    }
    info.num_elements = num_elements;

    auto offsets_it = value.find("data_offsets");
    if (offsets_it == value.end()) return bad("missing data_offsets");
    const Json& offsets = *offsets_it;
    if (!offsets.is_array() || offsets.size() != 2 || !AsSize(offsets[0]) || !AsSize(offsets[1])) {
      return bad("data_offsets ", JsonForMessage(offsets),
                 " is not a pair of non-negative integers");
    }
    const uint64_t begin = *AsSize(offsets[0]), end = *AsSize(offsets[1]);
    if (begin > end) return bad("data_offsets ", JsonForMessage(offsets), " has begin > end");
    if (end > data_size) {
      return bad("data_offsets ", JsonForMessage(offsets), " run past the data section (",
                 data_size, " bytes)");
    }
    if (end - begin != num_elements * item) {
      return bad("data_offsets ", JsonForMessage(offsets), " span ", end - begin,
                 " bytes but shape ", JsonForMessage(*shape_it), " of ",
                 std::string(SafetensorsDtypeName(info.dtype)), " needs ", num_elements * item);
    }
    info.begin = begin;
    info.end = end;
    tensors_.push_back(std::move(info));
  }

  std::sort(tensors_.begin(), tensors_.end(), [](const auto& a, const auto& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  size_t covered = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const SafetensorsTensorInfo& t = tensors_[i];
    if (t.begin < covered) {
      const SafetensorsTensorInfo& prev = tensors_[i - 1];
      return fail("tensors '", prev.name, "' [", prev.begin, ", ", prev.end, ") and '", t.name,
                  "' [", t.begin, ", ", t.end, ") overlap");
    }
    if (t.begin > covered) {
      return fail("data bytes [", covered, ", ", t.begin, ") belong to no tensor (before '", t.name,
                  "')");
    }
    covered = t.end;
    index_[t.name] = i;
  }
  if (covered != data_size) {
    return fail("data bytes [", covered, ", ", data_size,
                ") after the last tensor belong to "
                "no tensor");
  }
  return absl::OkStatus();
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> result;
  result.reserve(tensors_.size());
  for (const auto& t : tensors_) result.push_back(t.name);
  return result;
}

const SafetensorsTensorInfo* SafetensorsFile::Find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<absl::Span<const uint8_t>> SafetensorsFile::RawBytes(std::string_view name) const {
  const SafetensorsTensorInfo* info = Find(name);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor '", std::string(name), "'"));
  }
  if (data_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": read from a held descriptor, not mapped; use ReadFloat32"));
  }
  return absl::Span<const uint8_t>(data_ + info->begin, info->end - info->begin);
}

absl::Status SafetensorsFile::ReadFloat32(std::string_view name, absl::Span<float> out) const {
  const SafetensorsTensorInfo* info = Find(name);
  if (info != nullptr && out.size() != info->num_elements) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor '", std::string(name), "' has ",
                                                   info->num_elements, " elements; buffer holds ",
                                                   out.size()));
  }
  return ReadFloat32Range(name, 0, out);
}

absl::Status SafetensorsFile::ReadFloat32Range(std::string_view name, size_t first,
                                               absl::Span<float> out) const {
  const SafetensorsTensorInfo* info = Find(name);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor '", std::string(name), "'"));
  }
  if (first > info->num_elements || out.size() > info->num_elements - first) {
    return absl::OutOfRangeError(absl::StrCat(path_, ": tensor '", std::string(name), "' has ",
                                              info->num_elements, " elements; asked for [", first,
                                              ", ", first + out.size(), ")"));
  }
  const size_t item = SafetensorsDtypeSize(info->dtype);
  auto convert = [&](absl::Span<const uint8_t> bytes, absl::Span<float> into) -> absl::Status {
    absl::Status status = ConvertToFloat32(info->dtype, bytes, into);
    if (status.ok()) return status;
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": tensor '", std::string(name), "': ", status.message()));
  };
  if (data_ != nullptr) {
    return convert(absl::Span<const uint8_t>(data_ + info->begin + first * item, out.size() * item),
                   out);
  }
  // Not mapped: read in chunks of at most 4 MiB, converted as they arrive.
  const size_t per_chunk = std::max<size_t>(1, (size_t{4} << 20) / item);
  std::vector<uint8_t> chunk;
  for (size_t done = 0; done < out.size(); done += per_chunk) {
    const size_t n = std::min(per_chunk, out.size() - done);
    chunk.resize(n * item);
    const uint64_t offset = data_offset_ + info->begin + (first + done) * item;
    if (absl::Status s = PreadExactly(fd_.get(), offset, chunk.data(), chunk.size(), path_);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = convert(chunk, out.subspan(done, n)); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace megatrain::engine
