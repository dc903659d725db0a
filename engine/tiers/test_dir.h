// Test helper: a fresh block-backed scratch directory under TEST_TMPDIR for O_DIRECT tests.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/tiers/direct_io_directory.h"

namespace megatrain::engine::tiers {

// Empties and returns <TEST_TMPDIR or /var/tmp>/<name>; *usable is the O_DIRECT check's verdict.
inline std::string FreshTestDir(const std::string& name, absl::Status* usable) {
  const char* root = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(root != nullptr ? root : "/var/tmp", "/", name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  *usable = CheckDirectIoDirectory(dir);
  return dir;
}

}  // namespace megatrain::engine::tiers
