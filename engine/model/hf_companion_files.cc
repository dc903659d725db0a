// The tokenizer and generation files of an HF model directory (see hf_companion_files.h).
#include "engine/model/hf_companion_files.h"

#include <sys/stat.h>

#include <array>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "engine/common/safe_files.h"

namespace megatrain::engine {
namespace {

// What `save_pretrained` of a tokenizer and a generation config writes, across tokenizer kinds.
constexpr std::array<std::string_view, 11> kCompanionNames = {
    "tokenizer.json",        "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json",     "chat_template.jinja",   "chat_template.json",
    "generation_config.json", "tokenizer.model",      "vocab.json",
    "merges.txt",            "vocab.txt",
};

}  // namespace

bool IsHfCompanionFileName(std::string_view name) {
  for (std::string_view known : kCompanionNames) {
    if (name == known) return true;
  }
  return false;
}

absl::StatusOr<std::vector<HfCompanionFile>> ReadHfCompanionFiles(const std::string& dir,
                                                                  const InputFiles* inputs) {
  std::vector<HfCompanionFile> files;
  for (std::string_view name : kCompanionNames) {
    const std::string path = absl::StrCat(dir, "/", std::string(name));
    if (inputs != nullptr) {
      if (!inputs->Has(path)) continue;  // absent when the daemon checked the directory
    } else {
      struct stat st;
      if (lstat(path.c_str(), &st) != 0 && errno == ENOENT) continue;
    }
    absl::StatusOr<std::string> bytes =
        inputs != nullptr ? inputs->Read(path, kMaxHfCompanionFileBytes)
                          : ReadRegularFile(path, kMaxHfCompanionFileBytes);
    if (!bytes.ok()) return bytes.status();  // names the path
    files.push_back({std::string(name), *std::move(bytes)});
  }
  return files;
}

}  // namespace megatrain::engine
