// Strict JSON parsing for untrusted files: refuses duplicate keys, deep nesting and bad UTF-8.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace megatrain::engine {

// Nesting deeper than this is refused; no file we read needs more than 4.
inline constexpr int kMaxJsonDepth = 32;

// Parses `text` as one JSON value (surrounding whitespace allowed). Errors are
// InvalidArgument and start with `source` (e.g. the file name). Duplicate keys
// in any object are refused, because nlohmann would silently keep the last.
absl::StatusOr<nlohmann::json> ParseJsonStrict(std::string_view text, const std::string& source);

// Compact, bounded rendering of a JSON value for error messages.
std::string JsonForMessage(const nlohmann::json& value);

}  // namespace megatrain::engine
