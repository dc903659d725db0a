// Strict JSON field access (see json_fields.h).
#include "engine/provenance/json_fields.h"

#include <set>

#include "absl/strings/str_cat.h"

namespace megatrain::provenance::json_fields {

absl::Status ExactKeys(const nlohmann::json& object, std::initializer_list<const char*> keys,
                       const std::string& where) {
  if (!object.is_object())
    return absl::InvalidArgumentError(absl::StrCat(where, ": not an object"));
  std::set<std::string> wanted(keys.begin(), keys.end());
  for (auto it = object.begin(); it != object.end(); ++it) {
    if (!wanted.contains(it.key())) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": unknown key \"", it.key(), "\""));
    }
  }
  for (const std::string& k : wanted) {
    if (!object.contains(k)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": missing key \"", k, "\""));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> String(const nlohmann::json& object, const char* key,
                                   const std::string& where) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".", key, ": expected a string"));
  }
  return it->get<std::string>();
}

absl::StatusOr<uint64_t> Unsigned(const nlohmann::json& object, const char* key,
                                  const std::string& where) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_number_unsigned()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".", key, ": expected a non-negative integer"));
  }
  return it->get<uint64_t>();
}

absl::StatusOr<std::string> Hex(const nlohmann::json& object, const char* key, size_t hex_digits,
                                const std::string& where) {
  absl::StatusOr<std::string> text = String(object, key, where);
  if (!text.ok()) return text.status();
  bool ok = text->size() == hex_digits;
  for (char c : *text) ok = ok && ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'));
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".", key, ": \"", *text, "\" is not ",
                                                   hex_digits, " lower-case hex digits"));
  }
  return text;
}

absl::StatusOr<const nlohmann::json*> Array(const nlohmann::json& object, const char* key,
                                            const std::string& where) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".", key, ": expected an array"));
  }
  return &*it;
}

}  // namespace megatrain::provenance::json_fields
