// Test helper of the daemon's unit tests: fresh scratch directories under TEST_TMPDIR and files
// written there with given bytes (inputs for lineage and provenance tests).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace megatrain::server {

// Empties and returns <TEST_TMPDIR or /tmp>/<name>.
inline std::string TempDir(const char* name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir ? dir : "/tmp") + "/" + name;
  std::filesystem::remove_all(path);
  std::filesystem::create_directories(path);
  return path;
}

inline void Write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

}  // namespace megatrain::server
