// Fields of /proc/self/status in bytes (VmRSS, VmHWM, ...): what the memory
// tests and benchmarks compare with the planner's predictions.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace megatrain {

// The field's value ("VmHWM:   123 kB") in bytes; 0 when absent.
inline uint64_t ProcStatusBytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1)) * 1024;
  }
  return 0;
}

}  // namespace megatrain
