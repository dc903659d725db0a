// Byte-level tokenizer implementation.
#include "engine/data/byte_tokenizer.h"

namespace megatrain::engine {

void ByteTokenizer::Encode(std::string_view text, std::vector<int32_t>* tokens) {
  tokens->reserve(tokens->size() + text.size());
  for (unsigned char c : text) {
    if (c != kEndOfDocument) tokens->push_back(c);
  }
}

std::string ByteTokenizer::Decode(const std::vector<int32_t>& tokens) {
  std::string text;
  text.reserve(tokens.size());
  for (int32_t t : tokens) {
    if (t == kEndOfDocument) {
      text += "\n---\n";
    } else if (t > 0 && t < kVocabSize) {
      text.push_back(static_cast<char>(t));
    }
  }
  return text;
}

}  // namespace megatrain::engine
