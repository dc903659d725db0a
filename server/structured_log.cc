// StructuredLog (see structured_log.h).
#include "server/structured_log.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace megatrain::server {
namespace {

bool IsControl(unsigned char c) { return c < 0x20 || c == 0x7f; }

// Values are user-supplied (job names, paths, error messages naming them): a control character
// (CR, LF, ESC, NUL, ...) must never reach the log raw, where it could forge a line or drive a
// terminal (issue 16, point 13). Such values are quoted with \n, \r, \t or \xHH escapes.
std::string Quote(absl::string_view value) {
  bool plain = !value.empty();
  for (unsigned char c : value) {
    if (IsControl(c) || c == ' ' || c == '"' || c == '=' || c == '\\') plain = false;
  }
  if (plain) return std::string(value);
  std::string out = "\"";
  for (unsigned char c : value) {
    switch (c) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      default:
        break;
    }
    if (IsControl(c)) {
      absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
      continue;
    }
    out.push_back(static_cast<char>(c));
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
  std::fwrite(line.data(), 1, line.size(), out_);
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
