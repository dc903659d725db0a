// Byte-level tokenizer: token = byte value, 0 (never in text) separates documents.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace megatrain::engine {

class ByteTokenizer {
 public:
  static constexpr int kVocabSize = 256;
  static constexpr int32_t kEndOfDocument = 0;

  // Bytes map to themselves; a NUL byte inside text is dropped because it is
  // reserved for the end-of-document marker.
  static void Encode(std::string_view text, std::vector<int32_t>* tokens);
  static std::string Decode(const std::vector<int32_t>& tokens);
};

}  // namespace megatrain::engine
