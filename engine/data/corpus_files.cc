// The corpus file listing (see corpus_files.h).
#include "engine/data/corpus_files.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace megatrain::engine {

absl::StatusOr<std::vector<std::string>> ExpandCorpusFiles(const std::vector<std::string>& paths) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  for (const std::string& p : paths) {
    std::error_code ec;
    const fs::file_status st = fs::status(p, ec);
    if (ec || !fs::exists(st)) {
      return absl::NotFoundError(absl::StrCat("text file '", p, "' does not exist"));
    }
    if (!fs::is_directory(st)) {
      files.push_back(p);
      continue;
    }
    fs::directory_iterator it(p, ec);
    for (const fs::directory_iterator end; !ec && it != end; it.increment(ec)) {
      std::error_code entry_ec;
      if (it->is_symlink(entry_ec) || !it->is_regular_file(entry_ec)) continue;
      if (it->path().extension() == ".dat") continue;
      files.push_back(it->path().string());
    }
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot list text directory '", p, "': ", ec.message()));
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace megatrain::engine
