// Tests for the byte and SentencePiece tokenizers and document tokenization.
#include "engine/data/text_tokenizer.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "engine/data/sentencepiece_test_model.h"

namespace megatrain::engine {
namespace {

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

TEST(ByteTextTokenizerTest, RoundTripsAndSeparatesDocumentsWithZero) {
  ByteTextTokenizer bytes;
  EXPECT_EQ(bytes.name(), "bytes");
  EXPECT_EQ(bytes.vocab_size(), 256);
  EXPECT_EQ(bytes.end_of_document(), 0);
  const std::string text = "Odd sizes \xC3\xA9verywhere: 17 bytes?";
  std::vector<int32_t> tokens;
  ASSERT_TRUE(bytes.Encode(text, &tokens).ok());
  EXPECT_EQ(tokens.size(), text.size());
  absl::StatusOr<std::string> decoded = bytes.Decode(tokens);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(*decoded, text);

  absl::StatusOr<std::vector<int32_t>> docs = TokenizeDocuments({"ab", "c"}, bytes);
  ASSERT_TRUE(docs.ok());
  EXPECT_EQ(*docs, (std::vector<int32_t>{'a', 'b', 0, 'c', 0}));
  EXPECT_EQ(*bytes.Decode(*docs), "ab\n---\nc\n---\n");
}

TEST(ByteTextTokenizerTest, DecodeRefusesIdsOutsideTheVocabulary) {
  ByteTextTokenizer bytes;
  const std::vector<int32_t> tokens = {'a', 256};
  absl::StatusOr<std::string> decoded = bytes.Decode(tokens);
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(decoded.status().message().find("256"), std::string::npos);
}

TEST(CreateTextTokenizerTest, RefusesEmptyAndMissingModels) {
  absl::StatusOr<std::unique_ptr<TextTokenizer>> bytes = CreateTextTokenizer("bytes");
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ((*bytes)->vocab_size(), 256);
  EXPECT_FALSE(CreateTextTokenizer("").ok());
  absl::StatusOr<std::unique_ptr<TextTokenizer>> missing =
      CreateTextTokenizer("/nonexistent/megatrain/tok.model");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/megatrain/tok.model"), std::string::npos);
  const std::string garbage = TempDir() + "/garbage.model";
  std::ofstream(garbage) << "this is not a protobuf model";
  absl::StatusOr<std::unique_ptr<TextTokenizer>> bad = CreateTextTokenizer(garbage);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(garbage), std::string::npos);
}

class SentencePieceTokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string corpus = TempDir() + "/spm_corpus.txt";
    {
      std::ofstream out(corpus);
      const char* lines[] = {
          "the quick brown fox jumps over the lazy dog",
          "a stitch in time saves nine",
          "all that glitters is not gold",
          "the early bird catches the worm",
          "where there is smoke there is fire",
          "actions speak louder than words",
          "knowledge is power, and time is money!",
      };
      for (int repeat = 0; repeat < 7; ++repeat) {
        for (const char* line : lines) out << line << "\n";
      }
    }
    model_path_ = new std::string(TempDir() + "/tiny_spm.model");
    std::string error;
    ASSERT_TRUE(TrainTinySentencePieceModel(corpus, TempDir() + "/tiny_spm", 61, &error)) << error;
  }
  static void TearDownTestSuite() {
    delete model_path_;
    model_path_ = nullptr;
  }
  static std::string* model_path_;
};
std::string* SentencePieceTokenizerTest::model_path_ = nullptr;

TEST_F(SentencePieceTokenizerTest, RoundTripsTextWithTheModelsEos) {
  absl::StatusOr<std::unique_ptr<TextTokenizer>> sp = CreateTextTokenizer(*model_path_);
  ASSERT_TRUE(sp.ok()) << sp.status();
  const TextTokenizer& tok = **sp;
  EXPECT_EQ(tok.name(), *model_path_);
  EXPECT_GT(tok.vocab_size(), 3);
  EXPECT_LE(tok.vocab_size(), 61);
  EXPECT_EQ(tok.end_of_document(), 2);  // SentencePiece's default: unk 0, bos 1, eos 2

  const std::string text = "the lazy fox saves time, not gold";
  std::vector<int32_t> tokens;
  ASSERT_TRUE(tok.Encode(text, &tokens).ok());
  EXPECT_FALSE(tokens.empty());
  EXPECT_LT(tokens.size(), text.size());  // pieces longer than one character exist
  for (int32_t t : tokens) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, tok.vocab_size());
    EXPECT_NE(t, tok.end_of_document());
  }
  absl::StatusOr<std::string> decoded = tok.Decode(tokens);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, text);
}

TEST_F(SentencePieceTokenizerTest, PlacesEosAfterEveryDocument) {
  absl::StatusOr<std::unique_ptr<TextTokenizer>> sp = CreateTextTokenizer(*model_path_);
  ASSERT_TRUE(sp.ok()) << sp.status();
  const TextTokenizer& tok = **sp;
  const std::vector<std::string> docs = {"the early bird", "is power", "words"};
  absl::StatusOr<std::vector<int32_t>> tokens = TokenizeDocuments(docs, tok);
  ASSERT_TRUE(tokens.ok());
  std::vector<int32_t> expected;
  for (const std::string& d : docs) {
    ASSERT_TRUE(tok.Encode(d, &expected).ok());
    expected.push_back(tok.end_of_document());
  }
  EXPECT_EQ(*tokens, expected);
  int eos_count = 0;
  for (int32_t t : *tokens) eos_count += t == tok.end_of_document();
  EXPECT_EQ(eos_count, 3);
  EXPECT_EQ(tokens->back(), tok.end_of_document());
  EXPECT_EQ(*tok.Decode(*tokens), "the early bird\n---\nis power\n---\nwords\n---\n");

  const std::vector<int32_t> outside = {tok.vocab_size()};
  EXPECT_EQ(tok.Decode(outside).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace megatrain::engine
