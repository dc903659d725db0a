// StructuredLog (see structured_log.h).
#include "server/structured_log.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace megatrain::server {
namespace {

std::string Quote(absl::string_view value) {
  const bool plain = !value.empty() && value.find_first_of(" \t\n\"=") == absl::string_view::npos;
  if (plain) return std::string(value);
  std::string out = "\"";
  for (char c : value) {
    if (c == '"' || c == '\\') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

}  // namespace

void StructuredLog::Event(absl::string_view event, const Fields& fields) {
  std::string line = absl::StrCat(
      "ts=", absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()),
      " event=", Quote(event));
  for (const auto& [key, value] : fields) absl::StrAppend(&line, " ", key, "=", Quote(value));
  line.push_back('\n');
  std::lock_guard<std::mutex> lock(mu_);
  std::fputs(line.c_str(), out_);
  std::fflush(out_);
}

void StructuredLog::JobEvent(absl::string_view event, absl::string_view job_id,
                             const Fields& fields) {
  Fields all;
  all.reserve(fields.size() + 1);
  all.emplace_back("job", std::string(job_id));
  all.insert(all.end(), fields.begin(), fields.end());
  Event(event, all);
}

}  // namespace megatrain::server
