// megatrain_tokenize writes exactly the tokens training on the text would use
// (byte tokenizer and a SentencePiece model), in the format asked for, and
// refuses bad input with exit codes 1 and 2.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

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
  std::vector<int32_t> read(file->size());
  ASSERT_TRUE(file->Read(0, read.size(), read.data()).ok());
  EXPECT_EQ(read, *expected);
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

// Peak resident memory (KiB) of one run of the tool on `corpus`, from wait4's rusage.
long ToolPeakKib(const std::string& corpus, const std::string& out) {
  const std::string tool = std::string(getenv("TEST_SRCDIR")) + "/" +
                           std::string(getenv("TEST_WORKSPACE")) +
                           "/engine/data/megatrain_tokenize";
  const std::string out_flag = "--out=" + out;
  const pid_t pid = fork();
  if (pid == 0) {
    freopen("/dev/null", "w", stdout);
    execl(tool.c_str(), tool.c_str(), "--tokenizer=bytes", "--format=u32", out_flag.c_str(),
          corpus.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  struct rusage usage {};
  if (wait4(pid, &status, 0, &usage) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return -1;
  }
  return usage.ru_maxrss;
}

// The corpus is streamed (issue 16, point 6): tokenizing 48 MiB of text raises the tool's peak
// memory by a few MiB over a 1 KiB corpus, not by the corpus (held whole with its 4-byte
// tokens, it was over 200 MiB more). Same tool, same machine: the difference is the measure.
TEST(TokenizeToolTest, PeakMemoryDoesNotGrowWithTheCorpus) {
  const std::string small = Tmp("small.jsonl");
  std::ofstream(small) << "{\"text\": \"a small corpus\"}\n";
  const std::string large = Tmp("large.jsonl");
  {
    std::ofstream f(large);
    const std::string line =
        "{\"text\": \"" + std::string(1000, 'w') + " a line of text that repeats\"}\n";
    for (size_t written = 0; written < (size_t{48} << 20); written += line.size()) f << line;
  }
  const long small_kib = ToolPeakKib(small, Tmp("small.u32"));
  const long large_kib = ToolPeakKib(large, Tmp("large.u32"));
  ASSERT_GT(small_kib, 0);
  ASSERT_GT(large_kib, 0);
  EXPECT_LT(large_kib - small_kib, 24 * 1024)
      << "peak " << small_kib << " KiB on 1 KiB of text, " << large_kib << " KiB on 48 MiB";
  auto tokens = TokenFile::Open(Tmp("large.u32"), TokenFileFormat::kUint32);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_GT(tokens->size(), size_t{40} << 20);
}

TEST(TokenizeToolTest, BadInputExitCodes) {
  EXPECT_EQ(RunTool("--out=" + Tmp("x")), 2);                   // no inputs
  EXPECT_EQ(RunTool("--tokenizer=bytes " + WriteCorpus()), 2);  // no --out
  EXPECT_EQ(RunTool("--tokenizer=/no/such.model --out=" + Tmp("y") + " " + WriteCorpus()), 1);
  EXPECT_EQ(RunTool("--tokenizer=bytes --out=" + Tmp("z") + " /no/such/corpus.txt"), 1);
}

}  // namespace
}  // namespace megatrain::engine
