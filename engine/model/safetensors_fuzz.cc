// libFuzzer entry for the safetensors reader: any bytes must open cleanly or
// be refused with a status, never crash or read out of bounds (built and run
// by scripts/fuzz-safetensors, outside the Bazel build).
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/safetensors_reader.h"

namespace {

// Bounds the conversion work per input so the fuzzer stays fast.
constexpr size_t kMaxElementsToConvert = size_t{1} << 16;

void Exercise(const megatrain::engine::SafetensorsFile& file) {
  for (const megatrain::engine::SafetensorsTensorInfo& t : file.tensors()) {
    if (file.Find(t.name) != &t) __builtin_trap();
    if (!file.RawBytes(t.name).ok()) __builtin_trap();
    if (t.num_elements == 0 || t.num_elements > kMaxElementsToConvert) continue;
    std::vector<float> values(t.num_elements);
    (void)file.ReadFloat32(t.name, absl::MakeSpan(values));
    const size_t half = t.num_elements / 2;
    (void)file.ReadFloat32Range(t.name, half,
                                absl::MakeSpan(values).subspan(0, t.num_elements - half));
  }
  (void)file.RawBytes("__absent__");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The reader maps a path; an anonymous memory file gives it one without disk I/O.
  const int fd = memfd_create("safetensors_fuzz", 0);
  if (fd < 0) __builtin_trap();
  size_t written = 0;
  while (written < size) {
    const ssize_t n = write(fd, data + written, size - written);
    if (n <= 0) __builtin_trap();
    written += static_cast<size_t>(n);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  absl::StatusOr<megatrain::engine::SafetensorsFile> file =
      megatrain::engine::SafetensorsFile::Open(path);
  if (file.ok()) {
    Exercise(*file);
  } else if (file.status().message().empty()) {
    __builtin_trap();  // refusals must say what is wrong
  }
  close(fd);
  return 0;
}
