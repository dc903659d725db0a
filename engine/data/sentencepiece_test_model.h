// Tests' helper: trains a tiny SentencePiece model (absl-free, like the bridge).
#pragma once

#include <string>

namespace megatrain::engine {

// Trains a unigram model of at most `vocab_size` pieces on the lines of
// `corpus_path` (every character covered, one thread, deterministic) and
// writes `model_prefix`.model; false with `error` set on failure.
bool TrainTinySentencePieceModel(const std::string& corpus_path, const std::string& model_prefix,
                                 int vocab_size, std::string* error);

}  // namespace megatrain::engine
