// JSONL corpus reader (see jsonl_corpus.h).
#include "engine/data/jsonl_corpus.h"

#include "absl/strings/str_cat.h"
#include "engine/common/strict_json.h"

namespace megatrain::engine {

absl::StatusOr<std::optional<std::string>> JsonlLineDocument(std::string_view line,
                                                             const std::string& where) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (line.find_first_not_of(" \t") == std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": blank line; expected {\"text\": ...}"));
  }
  absl::StatusOr<nlohmann::json> value = ParseJsonStrict(line, where);
  if (!value.ok()) return value.status();
  if (!value->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": expected an object with a string \"text\", got ", JsonForMessage(*value)));
  }
  auto text = value->find("text");
  if (text == value->end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": the object has no \"text\" field"));
  }
  if (!text->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"text\" is ", JsonForMessage(*text), ", not a string"));
  }
  std::string doc = text->get<std::string>();
  if (doc.empty()) return std::optional<std::string>();
  return std::optional<std::string>(std::move(doc));
}

absl::StatusOr<std::vector<std::string>> ParseJsonlDocuments(std::string_view content,
                                                             const std::string& source) {
  std::vector<std::string> docs;
  size_t line_number = 0;
  size_t pos = 0;
  while (pos < content.size()) {
    ++line_number;
    size_t end = content.find('\n', pos);
    if (end == std::string_view::npos) end = content.size();
    absl::StatusOr<std::optional<std::string>> doc =
        JsonlLineDocument(content.substr(pos, end - pos), absl::StrCat(source, ":", line_number));
    pos = end + 1;
    if (!doc.ok()) return doc.status();
    if (doc->has_value()) docs.push_back(**std::move(doc));
  }
  return docs;
}

}  // namespace megatrain::engine
