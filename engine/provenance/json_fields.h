// Strict JSON field access for the provenance formats: every error names the
// source, the field and what was expected.
#pragma once

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace megatrain::provenance::json_fields {

// InvalidArgument unless `object` is an object with exactly the keys `keys`.
absl::Status ExactKeys(const nlohmann::json& object, std::initializer_list<const char*> keys,
                       const std::string& where);

absl::StatusOr<std::string> String(const nlohmann::json& object, const char* key,
                                   const std::string& where);
absl::StatusOr<uint64_t> Unsigned(const nlohmann::json& object, const char* key,
                                  const std::string& where);
// A lower-case hex string of exactly `hex_digits` digits.
absl::StatusOr<std::string> Hex(const nlohmann::json& object, const char* key, size_t hex_digits,
                                const std::string& where);
absl::StatusOr<const nlohmann::json*> Array(const nlohmann::json& object, const char* key,
                                            const std::string& where);

}  // namespace megatrain::provenance::json_fields
