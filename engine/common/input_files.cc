// InputFiles (see input_files.h).
#include "engine/common/input_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "engine/common/file_io.h"
#include "engine/common/safe_files.h"

namespace megatrain::engine {

void InputFiles::Add(const std::string& path, UniqueFd fd) { files_[path] = std::move(fd); }

std::vector<std::string> InputFiles::Paths() const {
  std::vector<std::string> out;
  for (const auto& [path, fd] : files_) out.push_back(path);
  return out;
}

absl::StatusOr<int> InputFiles::Descriptor(const std::string& path) const {
  auto it = files_.find(path);
  if (it == files_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", path, "' was not among the inputs checked when the job started; not read"));
  }
  return it->second.get();
}

absl::StatusOr<std::string> InputFiles::Read(const std::string& path, uint64_t max_bytes) const {
  absl::StatusOr<int> fd = Descriptor(path);
  if (!fd.ok()) return fd.status();
  return PreadAll(*fd, path, max_bytes);
}

absl::StatusOr<uint64_t> InputFiles::Size(const std::string& path) const {
  absl::StatusOr<int> fd = Descriptor(path);
  if (!fd.ok()) return fd.status();
  struct stat st;
  if (::fstat(*fd, &st) != 0) return ErrnoStatus(errno, absl::StrCat(path, ": fstat"));
  return static_cast<uint64_t>(st.st_size);
}

absl::StatusOr<UniqueFd> InputFiles::Duplicate(const std::string& path) const {
  absl::StatusOr<int> fd = Descriptor(path);
  if (!fd.ok()) return fd.status();
  UniqueFd dup(::fcntl(*fd, F_DUPFD_CLOEXEC, 0));
  if (!dup.valid()) return ErrnoStatus(errno, absl::StrCat(path, ": dup"));
  return dup;
}

absl::StatusOr<InputFiles> InputFiles::Clone() const {
  InputFiles out;
  for (const auto& [path, fd] : files_) {
    absl::StatusOr<UniqueFd> dup = Duplicate(path);
    if (!dup.ok()) return dup.status();
    out.Add(path, *std::move(dup));
  }
  return out;
}

absl::StatusOr<std::string> ReadInputFile(const InputFiles* inputs, const std::string& path,
                                          uint64_t max_bytes) {
  if (inputs == nullptr) return ReadRegularFile(path, max_bytes);
  return inputs->Read(path, max_bytes);
}

}  // namespace megatrain::engine
