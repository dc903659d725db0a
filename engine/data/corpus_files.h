// ExpandCorpusFiles: the one listing of a job's text corpus, used by training (what is read)
// and by the lineage (what is hashed), so the two always name the same files.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace megatrain::engine {

// The files named by `paths`, sorted by path: a file is taken as given; a directory contributes
// its regular files one level deep, skipping subdirectories, symlinks and *.dat (fortune index)
// files. NOT_FOUND names a path that does not exist; a directory that cannot be listed is an
// error naming it (never an exception).
absl::StatusOr<std::vector<std::string>> ExpandCorpusFiles(const std::vector<std::string>& paths);

}  // namespace megatrain::engine
