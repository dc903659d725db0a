// Opening a data file a run reads on demand (see checked_input_file.h).
#include "engine/data/checked_input_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/common/safe_files.h"

namespace megatrain::engine {

absl::StatusOr<CheckedInputFile> OpenCheckedInputFile(const std::string& path,
                                                      const InputFiles* inputs) {
  absl::StatusOr<UniqueFd> fd =
      inputs != nullptr ? inputs->Duplicate(path) : OpenRegularFileForRead(path);
  if (!fd.ok()) {
    if (fd.status().code() == absl::StatusCode::kInvalidArgument) return fd.status();
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", fd.status().message()));
  }
  // The size and type of what was opened, not of whatever the path names by now.
  struct stat st;
  if (::fstat(fd->get(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot stat: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is ", FileTypeName(st.st_mode), ", not a regular file"));
  }
  return CheckedInputFile{*std::move(fd), static_cast<uint64_t>(st.st_size)};
}

}  // namespace megatrain::engine
