// InputFiles: a run's inputs as descriptors the daemon opened and checked when the job started
// (issue 16, point 2). Readers given a set read through these descriptors, never by path again,
// so a file swapped, replaced by a symlink or a FIFO between the check and the read is not read.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/common/unique_fd.h"

namespace megatrain::engine {

class InputFiles {
 public:
  InputFiles() = default;
  InputFiles(InputFiles&&) = default;
  InputFiles& operator=(InputFiles&&) = default;
  InputFiles(const InputFiles&) = delete;
  InputFiles& operator=(const InputFiles&) = delete;

  // Holds `fd` (an opened, checked regular file) as the content of `path`, the name the job
  // gives it; a second Add for the same path replaces the first.
  void Add(const std::string& path, UniqueFd fd);
  bool Has(const std::string& path) const { return files_.count(path) != 0; }
  size_t size() const { return files_.size(); }
  std::vector<std::string> Paths() const;

  // The whole held file, read with pread from offset 0 (the descriptor's offset is never used,
  // so readers do not disturb each other); RESOURCE_EXHAUSTED past `max_bytes`. A path that was
  // not checked is FAILED_PRECONDITION: the read is refused rather than done by path.
  absl::StatusOr<std::string> Read(const std::string& path,
                                   uint64_t max_bytes = uint64_t{1} << 40) const;
  // The held file's size (fstat of the descriptor).
  absl::StatusOr<uint64_t> Size(const std::string& path) const;
  // A new descriptor (close-on-exec) of the held file, for a reader that maps it.
  absl::StatusOr<UniqueFd> Duplicate(const std::string& path) const;
  // Another set holding duplicates of every descriptor (to extend for one run without
  // changing the caller's set).
  absl::StatusOr<InputFiles> Clone() const;
  // The held descriptor itself (owned by the set); FAILED_PRECONDITION as Read.
  absl::StatusOr<int> Descriptor(const std::string& path) const;

 private:
  std::map<std::string, UniqueFd> files_;
};

// `inputs` null: ReadRegularFile(path) (tools run by the user on their own files); otherwise
// inputs->Read(path).
absl::StatusOr<std::string> ReadInputFile(const InputFiles* inputs, const std::string& path,
                                          uint64_t max_bytes = uint64_t{1} << 40);

}  // namespace megatrain::engine
