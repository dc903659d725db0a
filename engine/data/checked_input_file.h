// Opening a data file a run reads on demand: the job's checked descriptor duplicated (a daemon's
// run) or the path opened as a regular file (a tool run by the user), with its size fixed by fstat
// of the opened descriptor. The token-file and sample-set-file readers share it.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/common/input_files.h"
#include "engine/common/unique_fd.h"

namespace megatrain::engine {

// An opened regular file and its size when it was opened. Move-only (through UniqueFd).
struct CheckedInputFile {
  UniqueFd fd;
  uint64_t size = 0;
};

// With `inputs`, a duplicate of the descriptor the job checked for `path` (never `path` opened
// again); without, `path` opened as a regular file (a FIFO is refused without blocking).
// Anything but a regular file is INVALID_ARGUMENT "'<path>' is a FIFO, not a regular file"; a
// file that cannot be opened or stat'ed is NOT_FOUND "<path>: cannot open: <why>".
absl::StatusOr<CheckedInputFile> OpenCheckedInputFile(const std::string& path,
                                                      const InputFiles* inputs);

}  // namespace megatrain::engine
