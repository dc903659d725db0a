// CheckHfDirectoryFiles (see hf_directory_files.h).
#include "service/hf_directory_files.h"

#include <sys/stat.h>

#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/model/hf_companion_files.h"

namespace megatrain::service {

bool IsHeldHfDirectoryFile(const std::string& name) {
  return absl::EndsWith(name, ".json") || absl::EndsWith(name, ".safetensors") ||
         engine::IsHfCompanionFileName(name);
}

uint64_t HfDirectoryFileCap(const std::string& name) {
  if (name == "config.json") return kMaxHfConfigBytes;
  if (engine::IsHfCompanionFileName(name)) return engine::kMaxHfCompanionFileBytes;
  if (absl::EndsWith(name, ".json")) return kMaxHfOtherJsonBytes;
  return UINT64_MAX;  // weights: read in place by tensor, never whole
}

absl::Status CheckHfDirectoryFiles(const std::string& dir, const PathPolicy& paths) {
  std::error_code ec;
  int entries = 0;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (++entries > kMaxHfDirectoryEntries) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "model.hf_directory: '", dir, "' has more than ", kMaxHfDirectoryEntries, " entries"));
    }
    const std::string name = it->path().filename().string();
    const bool json = absl::EndsWith(name, ".json");
    const bool companion = engine::IsHfCompanionFileName(name);
    if (!json && !companion && !absl::EndsWith(name, ".safetensors")) continue;
    const std::string field = absl::StrCat("model.hf_directory: ", name);
    // Symlinks resolved and confined like any request path; FIFOs and devices refused by type.
    absl::StatusOr<std::string> real = paths.ResolveInput(field, it->path().string());
    if (!real.ok()) return real.status();
    struct stat st;
    if (stat(real->c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": '", *real, "' is not a regular file"));
    }
    const uint64_t cap = HfDirectoryFileCap(name);
    if ((json || companion) && static_cast<uint64_t>(st.st_size) > cap) {
      return absl::ResourceExhaustedError(
          absl::StrCat(field, ": ", st.st_size, " bytes, larger than ", cap >> 20, " MiB"));
    }
  }
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("model.hf_directory: cannot list '", dir, "': ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace megatrain::service
