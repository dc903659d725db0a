// Build-time fixture of the daemon's SentencePiece tests (a genrule runs it): writes a text
// corpus and a tiny SentencePiece model trained on it, in its own process so the tests that use
// them never load SentencePiece beside the daemon's protobuf.
// Usage: make_sentencepiece_fixture CORPUS_OUT MODEL_OUT VOCAB_SIZE
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "engine/data/sentencepiece_test_model.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s CORPUS_OUT MODEL_OUT VOCAB_SIZE\n", argv[0]);
    return 2;
  }
  {
    std::ofstream corpus(argv[1]);
    const char* words[] = {"quick", "brown", "lazy", "clever", "sleepy", "small", "loud"};
    for (int i = 0; i < 301; ++i) {
      corpus << "Fortune " << i << ": the " << words[i % 7] << " fox jumps over the "
             << words[(i * 3 + 1) % 7] << " dog " << i * 7 << " times.\n%\n";
    }
    if (!corpus) return 1;
  }
  char scratch[] = "/tmp/mt-sp-fixture.XXXXXX";
  if (mkdtemp(scratch) == nullptr) return 1;
  const std::string prefix = std::string(scratch) + "/sp";
  std::string error;
  const bool trained =
      megatrain::engine::TrainTinySentencePieceModel(argv[1], prefix, std::atoi(argv[3]), &error);
  std::error_code ec;
  if (trained) std::filesystem::copy_file(prefix + ".model", argv[2], ec);
  std::filesystem::remove_all(scratch);
  if (!trained || ec) {
    std::fprintf(stderr, "make_sentencepiece_fixture: %s\n",
                 trained ? ec.message().c_str() : error.c_str());
    return 1;
  }
  return 0;
}
