// JSON Lines corpora: one object per line whose string field "text" is a
// document (other fields are ignored). Strict: every line must be such an
// object; errors name the file and the 1-based line number.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace megatrain::engine {

// The document of one JSONL line (a "\r" at its end is dropped); `where` ("file:line") starts
// every error. A blank line is an error; an empty "text" is no document (nullopt).
absl::StatusOr<std::optional<std::string>> JsonlLineDocument(std::string_view line,
                                                             const std::string& where);

// Documents of JSONL `content` in line order; `source` (the file name) starts
// every error. A final newline ends the last line; a "\r" before a newline is
// dropped. Blank lines are errors; documents with empty text are skipped.
absl::StatusOr<std::vector<std::string>> ParseJsonlDocuments(std::string_view content,
                                                             const std::string& source);

}  // namespace megatrain::engine
