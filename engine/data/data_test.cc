// Tests for the byte tokenizer, the fortune corpus reader and token windows.
#include <gtest/gtest.h>

#include <set>

#include "engine/data/byte_tokenizer.h"
#include "engine/data/text_corpus.h"
#include "engine/data/token_windows.h"

namespace megatrain::engine {
namespace {

TEST(ByteTokenizerTest, RoundTripsTextAndDropsNul) {
  std::vector<int32_t> tokens;
  ByteTokenizer::Encode(std::string("a\0b\xC3\xA9", 5), &tokens);
  EXPECT_EQ(tokens, (std::vector<int32_t>{'a', 'b', 0xC3, 0xA9}));
  EXPECT_EQ(ByteTokenizer::Decode(tokens), "ab\xC3\xA9");
}

TEST(TextCorpusTest, SplitsFortunesOnPercentLines) {
  const auto docs = SplitFortunes("one\nline\n%\n\n%\ntwo\n%\n");
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0], "one\nline");
  EXPECT_EQ(docs[1], "two");
}

TEST(TextCorpusTest, MissingFileIsNotFound) {
  const auto docs = LoadFortuneDocuments({"/nonexistent/megatrain/corpus"});
  EXPECT_EQ(docs.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(docs.status().message().find("/nonexistent/megatrain/corpus"), std::string::npos);
}

std::vector<int32_t> Iota(int n) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

TEST(TokenWindowsTest, TargetsAreInputsShiftedByOne) {
  auto w = TokenWindows::Create(Iota(1000), 7, 0.1, 42);
  ASSERT_TRUE(w.ok()) << w.status();
  const WindowBatch b = *w->NextTrainBatch(3);
  for (int r = 0; r < 3; ++r) {
    for (int t = 0; t < 7; ++t) {
      EXPECT_EQ(b.targets[r * 7 + t], b.inputs[r * 7 + t] + 1);
    }
  }
}

TEST(TokenWindowsTest, EpochVisitsEveryWindowOnceAndShuffleIsDeterministic) {
  auto a = TokenWindows::Create(Iota(1001), 10, 0.2, 7);
  auto b = TokenWindows::Create(Iota(1001), 10, 0.2, 7);
  ASSERT_TRUE(a.ok() && b.ok());
  const size_t n = a->train_windows();
  std::set<int32_t> firsts;
  for (size_t i = 0; i < n; ++i) {
    const WindowBatch x = *a->NextTrainBatch(1);
    const WindowBatch y = *b->NextTrainBatch(1);
    EXPECT_EQ(x.inputs, y.inputs);
    firsts.insert(x.inputs[0]);
    EXPECT_LT(x.inputs[0] + 10, 801);  // never reads into the validation split
  }
  EXPECT_EQ(firsts.size(), n);
}

TEST(TokenWindowsTest, CursorRestoresTheSameStream) {
  auto a = TokenWindows::Create(Iota(5000), 16, 0.1, 3);
  ASSERT_TRUE(a.ok());
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(a->NextTrainBatch(5).ok());
  auto b = TokenWindows::Create(Iota(5000), 16, 0.1, 3);
  ASSERT_TRUE(b.ok());
  b->set_cursor(a->cursor());
  EXPECT_EQ(a->NextTrainBatch(4)->inputs, b->NextTrainBatch(4)->inputs);
}

TEST(TokenWindowsTest, RejectsBadArgumentsNamingTheField) {
  EXPECT_NE(TokenWindows::Create(Iota(100), 0, 0.1, 1).status().message().find("seq_len"),
            std::string::npos);
  EXPECT_NE(
      TokenWindows::Create(Iota(100), 8, 0.9, 1).status().message().find("validation_fraction"),
      std::string::npos);
  EXPECT_FALSE(TokenWindows::Create(Iota(5), 8, 0.0, 1).ok());
}

}  // namespace
}  // namespace megatrain::engine
