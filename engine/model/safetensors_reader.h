// SafetensorsFile: a strict, bounds-checked, read-only memory map of one .safetensors file.
//
// Format: u64 little-endian header length N, then N bytes of UTF-8 JSON (an
// object: tensor name -> {"dtype", "shape", "data_offsets": [begin, end]}, plus
// an optional "__metadata__" string -> string map), then the data section.
// Offsets are relative to the data section. Open() refuses anything malformed:
// a header over 100 MiB or past the end of the file, invalid or duplicate-key
// JSON, unknown dtypes or fields, shapes whose size overflows, offsets out of
// range or disagreeing with shape x dtype size, and tensors that overlap or
// leave bytes of the data section unaccounted for (as the reference
// implementation does). Errors name the file, the tensor and the problem.
// The map is private and read-only; truncating the file while it is open is
// undefined (SIGBUS), as with any mmap reader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/common/input_files.h"
#include "engine/common/unique_fd.h"
#include "engine/model/safetensors_dtype.h"

namespace megatrain::engine {

inline constexpr uint64_t kMaxSafetensorsHeaderBytes = uint64_t{100} << 20;

struct SafetensorsTensorInfo {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;
  size_t num_elements = 0;
  size_t begin = 0;  // byte offsets within the data section
  size_t end = 0;
};

class SafetensorsFile {
 public:
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);
  // With `inputs` (a daemon's run): maps a duplicate of the checked descriptor held for `path`
  // instead of opening the path again; null `inputs` is Open(path).
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path, const InputFiles* inputs);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  // All tensors, in data-section order.
  const std::vector<SafetensorsTensorInfo>& tensors() const { return tensors_; }
  std::vector<std::string> names() const;
  // nullptr when absent.
  const SafetensorsTensorInfo* Find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The tensor's bytes inside the map (little-endian, possibly unaligned).
  absl::StatusOr<absl::Span<const uint8_t>> RawBytes(std::string_view name) const;

  // Converts the whole tensor to fp32 (see ConvertToFloat32); out.size() must
  // equal its element count.
  absl::Status ReadFloat32(std::string_view name, absl::Span<float> out) const;
  // Elements [first, first + out.size()) of the flattened tensor.
  absl::Status ReadFloat32Range(std::string_view name, size_t first, absl::Span<float> out) const;

 private:
  // Checks and maps the open file `fd` (closed once mapped); errors name `path`.
  static absl::StatusOr<SafetensorsFile> OpenDescriptor(UniqueFd fd, const std::string& path);
  SafetensorsFile() = default;
  absl::Status ParseHeader(std::string_view header, size_t data_size);
  void Unmap();

  std::string path_;
  const uint8_t* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::vector<SafetensorsTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

}  // namespace megatrain::engine
