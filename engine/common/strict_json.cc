// Strict JSON parsing for untrusted files: refuses duplicate keys, deep nesting and bad UTF-8.
#include "engine/common/strict_json.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace megatrain::engine {

absl::StatusOr<nlohmann::json> ParseJsonStrict(std::string_view text, const std::string& source) {
  using Event = nlohmann::json::parse_event_t;
  std::vector<std::set<std::string>> keys_per_open_object;
  std::string problem;
  auto callback = [&](int depth, Event event, nlohmann::json& parsed) {
    if (!problem.empty()) return false;
    if (depth > kMaxJsonDepth) {
      problem = absl::StrCat("nesting deeper than ", kMaxJsonDepth);
      return false;
    }
    switch (event) {
      case Event::object_start:
        keys_per_open_object.emplace_back();
        break;
      case Event::object_end:
        if (!keys_per_open_object.empty()) keys_per_open_object.pop_back();
        break;
      case Event::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (!keys_per_open_object.empty() && !keys_per_open_object.back().insert(key).second) {
          problem = absl::StrCat("duplicate key '", key, "'");
          return false;
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  nlohmann::json result;
  try {
    result = nlohmann::json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true,
                                   /*ignore_comments=*/false);
  } catch (const nlohmann::json::exception& e) {
    if (problem.empty()) problem = e.what();
  }
  if (!problem.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": invalid JSON: ", problem));
  }
  if (result.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": invalid JSON"));
  }
  return result;
}

std::string JsonForMessage(const nlohmann::json& value) {
  constexpr size_t kMaxChars = 120;
  std::string text =
      value.dump(-1, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace);
  if (text.size() > kMaxChars) text = absl::StrCat(text.substr(0, kMaxChars), "...");
  return text;
}

}  // namespace megatrain::engine
