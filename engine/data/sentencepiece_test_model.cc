// Tiny SentencePiece model training for tests.
#include "engine/data/sentencepiece_test_model.h"

#include <sentencepiece_trainer.h>

namespace megatrain::engine {

bool TrainTinySentencePieceModel(const std::string& corpus_path, const std::string& model_prefix,
                                 int vocab_size, std::string* error) {
  const std::string args = "--input=" + corpus_path + " --model_prefix=" + model_prefix +
                           " --vocab_size=" + std::to_string(vocab_size) +
                           " --model_type=unigram --character_coverage=1.0"
                           " --hard_vocab_limit=false --num_threads=1 --minloglevel=2";
  const sentencepiece::util::Status status = sentencepiece::SentencePieceTrainer::Train(args);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

}  // namespace megatrain::engine
