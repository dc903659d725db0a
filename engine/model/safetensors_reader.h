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
// undefined (SIGBUS), as with any mmap reader. A file opened from a daemon's held
// inputs is not mapped but read with pread (truncation is then an error).
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
  // With `inputs` (a daemon's run): reads a duplicate of the checked descriptor held for `path`
  // instead of opening the path again, with pread, never mapped: the file's owner may truncate
  // it while a job loads it, and a mapped access would then be SIGBUS and kill the daemon
  // (issue 16, point 4); a short read is DATA_LOSS instead. Null `inputs` is Open(path).
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path, const InputFiles* inputs);
  // `path` opened (a regular file only) and read with pread like a held input, never mapped:
  // for files in directories other users can write to (a daemon's checkpoints).
  static absl::StatusOr<SafetensorsFile> OpenUnmapped(const std::string& path);

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

  // The tensor's bytes inside the map (little-endian, possibly unaligned); FAILED_PRECONDITION
  // for a file read from held inputs (nothing is mapped; use ReadFloat32).
  absl::StatusOr<absl::Span<const uint8_t>> RawBytes(std::string_view name) const;

  // Converts the whole tensor to fp32 (see ConvertToFloat32); out.size() must
  // equal its element count.
  absl::Status ReadFloat32(std::string_view name, absl::Span<float> out) const;
  // Elements [first, first + out.size()) of the flattened tensor.
  absl::Status ReadFloat32Range(std::string_view name, size_t first, absl::Span<float> out) const;

 private:
  // Checks the open file `fd` and maps it (`map`; fd closed once mapped) or keeps it to read
  // with pread; errors name `path`.
  static absl::StatusOr<SafetensorsFile> OpenDescriptor(UniqueFd fd, const std::string& path,
                                                        bool map);
  SafetensorsFile() = default;
  absl::Status ParseHeader(std::string_view header, size_t data_size);
  void Unmap();

  std::string path_;
  const uint8_t* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data section (mapped files)
  UniqueFd fd_;                    // read with pread instead (files from held inputs)
  uint64_t data_offset_ = 0;       // where the data section starts in fd_
  std::vector<SafetensorsTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

}  // namespace megatrain::engine
