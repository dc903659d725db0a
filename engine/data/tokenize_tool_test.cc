// megatrain_tokenize writes exactly the tokens training on the text would use
// (byte tokenizer and a SentencePiece model), in the format asked for, and
// refuses bad input with exit codes 1 and 2.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/data/sentencepiece_test_model.h"
#include "engine/data/text_corpus.h"
#include "engine/data/text_tokenizer.h"
#include "engine/data/token_file.h"

namespace megatrain::engine {
namespace {

std::string Tmp(const std::string& name) { return std::string(getenv("TEST_TMPDIR")) + "/" + name; }

int RunTool(const std::string& args) {
  const std::string tool = std::string(getenv("TEST_SRCDIR")) + "/" +
                           std::string(getenv("TEST_WORKSPACE")) +
                           "/engine/data/megatrain_tokenize";
  const int status = std::system((tool + " " + args + " > /dev/null 2>&1").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string WriteCorpus() {
  const std::string path = Tmp("corpus.txt");
  std::ofstream f(path);
  for (int i = 0; i < 40; ++i) {
    f << "The quick brown fox " << i << " jumps over the lazy dog.\n";
    if (i % 7 == 6) f << "\n";
  }
  return path;
}

void ExpectSameTokens(const std::string& tokenizer, const std::string& format,
                      TokenFileFormat read_as) {
  const std::string corpus = WriteCorpus();
  const std::string out = Tmp("tokens_" + format);
  ASSERT_EQ(
      RunTool("--tokenizer=" + tokenizer + " --format=" + format + " --out=" + out + " " + corpus),
      0);
  auto t = CreateTextTokenizer(tokenizer);
  ASSERT_TRUE(t.ok()) << t.status();
  auto docs = LoadTextDocuments({corpus});
  ASSERT_TRUE(docs.ok()) << docs.status();
  auto expected = TokenizeDocuments(*docs, **t);
  ASSERT_TRUE(expected.ok()) << expected.status();
  auto file = TokenFile::Open(out, read_as);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->size(), expected->size());
  for (size_t i = 0; i < expected->size(); ++i) ASSERT_EQ(file->at(i), (*expected)[i]) << i;
}

TEST(TokenizeToolTest, BytesAsU16AndU32) {
  ExpectSameTokens("bytes", "u16", TokenFileFormat::kUint16);
  ExpectSameTokens("bytes", "u32", TokenFileFormat::kUint32);
}

TEST(TokenizeToolTest, SentencePieceModel) {
  const std::string prefix = Tmp("sp");
  std::string error;
  ASSERT_TRUE(TrainTinySentencePieceModel(WriteCorpus(), prefix, 60, &error)) << error;
  ExpectSameTokens(prefix + ".model", "auto", TokenFileFormat::kUint16);
}

// The report is JSON written by a JSON writer: an output path with a quote and a backslash
// round-trips (issue 21, point 8).
TEST(TokenizeToolTest, ReportIsJsonWithTheOutputPathEscaped) {
  const std::string out = Tmp("we\"ird\\name.tok");
  const std::string report_path = Tmp("report.json");
  const std::string tool = std::string(getenv("TEST_SRCDIR")) + "/" +
                           std::string(getenv("TEST_WORKSPACE")) +
                           "/engine/data/megatrain_tokenize";
  const int status = std::system(
      (tool + " --tokenizer=bytes '--out=" + out + "' " + WriteCorpus() + " > " + report_path)
          .c_str());
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  std::ifstream in(report_path);
  const nlohmann::json report = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(report.is_object());
  EXPECT_EQ(report["out"].get<std::string>(), out);
  EXPECT_EQ(report["format"].get<std::string>(), "u16");
  EXPECT_GT(report["tokens"].get<uint64_t>(), 0u);
}

TEST(TokenizeToolTest, BadInputExitCodes) {
  EXPECT_EQ(RunTool("--out=" + Tmp("x")), 2);                   // no inputs
  EXPECT_EQ(RunTool("--tokenizer=bytes " + WriteCorpus()), 2);  // no --out
  EXPECT_EQ(RunTool("--tokenizer=/no/such.model --out=" + Tmp("y") + " " + WriteCorpus()), 1);
  EXPECT_EQ(RunTool("--tokenizer=bytes --out=" + Tmp("z") + " /no/such/corpus.txt"), 1);
}

}  // namespace
}  // namespace megatrain::engine
