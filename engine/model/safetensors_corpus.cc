// A corpus of malformed .safetensors files, each with the error the reader must give.
#include "engine/model/safetensors_corpus.h"

#include <cstdint>

namespace megatrain::engine {
namespace {

std::string LengthPrefix(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out;
}

}  // namespace

std::string SafetensorsBytes(const std::string& header, const std::string& data) {
  return LengthPrefix(header.size()) + header + data;
}

std::vector<SafetensorsCorpusCase> MalformedSafetensorsCases() {
  const std::string eight(8, '\x11');
  const std::string twelve(12, '\x22');
  std::vector<SafetensorsCorpusCase> cases = {
      {"bad_truncated_length.safetensors", std::string("\x10\x00\x00\x00\x00", 5),
       "too short for the 8-byte header length"},
      {"bad_empty_file.safetensors", "", "too short for the 8-byte header length"},
      {"bad_header_past_eof.safetensors", LengthPrefix(1000) + "{\"a\":1}",
       "runs past the end of the file"},
      {"bad_header_too_large.safetensors", LengthPrefix(uint64_t{200} << 20) + "{}",
       "exceeds the limit"},
      {"bad_header_length_huge.safetensors", LengthPrefix(~uint64_t{0}) + "{}",
       "exceeds the limit"},
      {"bad_zero_header.safetensors", LengthPrefix(0), "must be a JSON object"},
      {"bad_json.safetensors", SafetensorsBytes("{\"w\": {\"dtype\": ", ""), "invalid JSON"},
      {"bad_json_trailing_garbage.safetensors", SafetensorsBytes("{} x", ""), "invalid JSON"},
      {"bad_utf8.safetensors", SafetensorsBytes("{\"w\xff\": 1}", ""), "invalid JSON"},
      {"bad_non_object_header.safetensors", SafetensorsBytes("[1, 2]", ""),
       "must be a JSON object"},
      {"bad_entry_not_object.safetensors", SafetensorsBytes("{\"w\": 5}", ""),
       "tensor 'w': entry is not an object"},
      {"bad_overlapping_offsets.safetensors",
       SafetensorsBytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                        "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                        twelve),
       "overlap"},
      {"bad_offsets_past_end.safetensors",
       SafetensorsBytes("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", eight),
       "run past the data section"},
      {"bad_wrong_byte_count.safetensors",
       SafetensorsBytes("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", eight),
       "span 8 bytes but shape [3] of F32 needs 12"},
      {"bad_begin_after_end.safetensors",
       SafetensorsBytes("{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,4]}}", eight),
       "begin > end"},
      {"bad_shape_overflow.safetensors",
       SafetensorsBytes("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],"
                        "\"data_offsets\":[0,8]}}",
                        eight),
       "overflows"},
      {"bad_shape_byte_overflow.safetensors",
       SafetensorsBytes("{\"w\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],"
                        "\"data_offsets\":[0,8]}}",
                        eight),
       "overflows the byte count"},
      {"bad_negative_dim.safetensors",
       SafetensorsBytes("{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", eight),
       "not a non-negative integer"},
      {"bad_float_dim.safetensors",
       SafetensorsBytes("{\"w\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}",
                        eight),
       "not a non-negative integer"},
      {"bad_unknown_dtype.safetensors",
       SafetensorsBytes("{\"w\":{\"dtype\":\"F8_E4M3\",\"shape\":[8],\"data_offsets\":[0,8]}}",
                        eight),
       "unknown or unsupported dtype \"F8_E4M3\""},
      {"bad_missing_dtype.safetensors",
       SafetensorsBytes("{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", eight), "missing dtype"},
      {"bad_missing_offsets.safetensors",
       SafetensorsBytes("{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}", eight),
       "missing data_offsets"},
      {"bad_offsets_not_pair.safetensors",
       SafetensorsBytes("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", eight),
       "is not a pair of non-negative integers"},
      {"bad_unknown_field.safetensors",
       SafetensorsBytes(
           "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"stride\":[1]}}",
           eight),
       "unknown field 'stride'"},
      {"bad_duplicate_names.safetensors",
       SafetensorsBytes("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                        "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                        eight),
       "duplicate key 'w'"},
      {"bad_gap_in_data.safetensors",
       SafetensorsBytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                        "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                        twelve),
       "belong to no tensor"},
      {"bad_trailing_data.safetensors",
       SafetensorsBytes("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", eight),
       "after the last tensor belong to no tensor"},
      {"bad_metadata_not_string.safetensors",
       SafetensorsBytes("{\"__metadata__\":{\"format\":1}}", ""), "is not a string"},
      {"bad_metadata_not_object.safetensors", SafetensorsBytes("{\"__metadata__\":\"pt\"}", ""),
       "__metadata__ must be an object"},
      {"bad_deep_nesting.safetensors",
       SafetensorsBytes("{\"__metadata__\":" + std::string(200, '[') + std::string(200, ']') + "}",
                        ""),
       "nesting deeper than"},
  };
  return cases;
}

}  // namespace megatrain::engine
