// StructuredLog: one line per event, `ts=... event=... key=value ...`, job id in every job line.
#pragma once

#include <cstdio>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace megatrain::server {

class StructuredLog {
 public:
  using Fields = std::vector<std::pair<absl::string_view, std::string>>;

  explicit StructuredLog(std::FILE* out) : out_(out) {}

  // Writes `ts=<RFC3339> event=<event> <k>=<v>...`; values with spaces or quotes are quoted.
  void Event(absl::string_view event, const Fields& fields = {});
  // As Event, with `job=<job_id>` first.
  void JobEvent(absl::string_view event, absl::string_view job_id, const Fields& fields = {});

 private:
  std::mutex mu_;
  std::FILE* out_;
};

}  // namespace megatrain::server
