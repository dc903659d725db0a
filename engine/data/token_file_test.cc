// Token files: raw u16/u32 and llm.c headers, refusals naming the file, and
// windows over mapped files equal to windows over the same tokens in memory.
#include "engine/data/token_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "engine/data/token_windows.h"

namespace megatrain::engine {
namespace {

std::string Write(const std::string& name, const void* data, size_t bytes) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary).write(static_cast<const char*>(data), bytes);
  return path;
}

template <typename T>
std::string WriteTokens(const std::string& name, const std::vector<T>& tokens, int llmc_version) {
  std::vector<uint8_t> bytes;
  if (llmc_version > 0) {
    std::vector<int32_t> header(kLlmcHeaderInts, 0);
    header[0] = kLlmcMagic;
    header[1] = llmc_version;
    header[2] = static_cast<int32_t>(tokens.size());
    bytes.resize(header.size() * 4);
    std::memcpy(bytes.data(), header.data(), bytes.size());
  }
  const size_t at = bytes.size();
  bytes.resize(at + tokens.size() * sizeof(T));
  std::memcpy(bytes.data() + at, tokens.data(), tokens.size() * sizeof(T));
  return Write(name, bytes.data(), bytes.size());
}

TEST(TokenFileTest, ReadsRawAndLlmcFormats) {
  const std::vector<uint16_t> small = {1, 65535, 7, 300, 0};
  const std::vector<uint32_t> large = {70000, 1, 2, 151643};
  struct Case {
    std::string path;
    TokenFileFormat format;
    std::vector<int32_t> want;
  };
  const std::vector<Case> cases = {
      {WriteTokens("a.u16", small, 0), TokenFileFormat::kUint16, {1, 65535, 7, 300, 0}},
      {WriteTokens("a.u32", large, 0), TokenFileFormat::kUint32, {70000, 1, 2, 151643}},
      {WriteTokens("a1.bin", small, 1), TokenFileFormat::kLlmc, {1, 65535, 7, 300, 0}},
      {WriteTokens("a2.bin", large, 2), TokenFileFormat::kLlmc, {70000, 1, 2, 151643}},
  };
  for (const Case& c : cases) {
    auto f = TokenFile::Open(c.path, c.format);
    ASSERT_TRUE(f.ok()) << f.status();
    ASSERT_EQ(f->size(), c.want.size()) << c.path;
    std::vector<int32_t> read(c.want.size());
    ASSERT_TRUE(f->Read(0, read.size(), read.data()).ok()) << c.path;
    EXPECT_EQ(read, c.want) << c.path;
    // Any range, including an empty one at the end.
    ASSERT_TRUE(f->Read(1, 2, read.data()).ok());
    EXPECT_EQ(read[0], c.want[1]);
    EXPECT_EQ(read[1], c.want[2]);
    EXPECT_TRUE(f->Read(c.want.size(), 0, read.data()).ok());
    EXPECT_EQ(f->Read(c.want.size() - 1, 2, read.data()).code(), absl::StatusCode::kOutOfRange);
  }
  EXPECT_EQ(*ParseTokenFileFormat("llmc"), TokenFileFormat::kLlmc);
  EXPECT_FALSE(ParseTokenFileFormat("u8").ok());
}

TEST(TokenFileTest, RefusesMalformedFilesNamingThem) {
  const uint8_t three[3] = {1, 2, 3};
  const std::string odd = Write("odd.u16", three, 3);
  auto f = TokenFile::Open(odd, TokenFileFormat::kUint16);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find(odd), std::string::npos);

  std::vector<uint16_t> tokens = {1, 2, 3};
  const std::string good = WriteTokens("v1.bin", tokens, 1);
  std::string bytes;
  {
    std::ifstream in(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::string bad_magic = bytes;
  bad_magic[0] ^= 1;
  std::string bad_count = bytes;
  bad_count[8] = 4;
  std::string bad_version = bytes;
  bad_version[4] = 3;
  for (const auto& [name, content, what] :
       {std::tuple{"magic.bin", bad_magic, "magic"}, std::tuple{"count.bin", bad_count, "says 4"},
        std::tuple{"version.bin", bad_version, "version 3"},
        std::tuple{"short.bin", bytes.substr(0, 100), "shorter"}}) {
    const std::string path = Write(name, content.data(), content.size());
    auto r = TokenFile::Open(path, TokenFileFormat::kLlmc);
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status();
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status();
  }
  EXPECT_EQ(TokenFile::Open("/nonexistent/x.bin", TokenFileFormat::kUint16).status().code(),
            absl::StatusCode::kNotFound);
}

// Issue 16, point 4: the file's owner truncates it while a job reads it. A mapped file would
// raise SIGBUS on the next access and kill the daemon; the tokens read at open stay valid.
// A file truncated while in use (its owner's doing) fails the read that meets the cut, naming the
// file and the offset: never SIGBUS, never tokens that were not in the file.
TEST(TokenFileTest, TruncationWhileInUseFailsTheReadNamingTheFile) {
  std::vector<uint16_t> tokens(1 << 16);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i * 7);
  const std::string path = WriteTokens("truncated.u16", tokens, 0);
  absl::StatusOr<TokenFiles> f = TokenFiles::Open({path}, TokenFileFormat::kUint16);
  ASSERT_TRUE(f.ok()) << f.status();
  int32_t t = -1;
  ASSERT_TRUE(f->Read(12345, 1, &t).ok());
  EXPECT_EQ(t, static_cast<int32_t>(tokens[12345]));
  ASSERT_EQ(::truncate(path.c_str(), 1000), 0);
  EXPECT_TRUE(f->Read(100, 1, &t).ok());  // before the cut
  const absl::Status s = f->Read(12345, 1, &t);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(path), std::string::npos) << s;
  EXPECT_NE(s.message().find("24690"), std::string::npos) << s;  // the offset asked for
  EXPECT_EQ(f->MaxToken().status().code(), absl::StatusCode::kDataLoss);
}

// Windows read through a source whose file is cut short fail with the error; the cursor does not
// move, so the failure is reported, not skipped.
TEST(TokenFileTest, WindowsOverATruncatedFileFailAndKeepTheCursor) {
  std::vector<uint16_t> tokens(4096);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i % 500);
  const std::string path = WriteTokens("cut.u16", tokens, 0);
  auto files = TokenFiles::Open({path}, TokenFileFormat::kUint16);
  ASSERT_TRUE(files.ok()) << files.status();
  auto w = TokenWindows::Create(std::make_shared<TokenFiles>(std::move(*files)), 16, 0.1, 3);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(w->NextTrainBatch(2).ok());
  const uint64_t cursor = w->cursor();
  ASSERT_EQ(::truncate(path.c_str(), 0), 0);
  absl::StatusOr<WindowBatch> b = w->NextTrainBatch(2);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kDataLoss) << b.status();
  EXPECT_EQ(w->cursor(), cursor);
  EXPECT_EQ(w->ValidationBatch(0, 1).status().code(), absl::StatusCode::kDataLoss);
}

// Issue 16, point 3: a FIFO (or device) as a token file is refused at once, never waited on.
TEST(TokenFileTest, RefusesAFifoAndADeviceWithoutBlocking) {
  const std::string fifo = ::testing::TempDir() + "/tokens.fifo";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  absl::StatusOr<TokenFile> f = TokenFile::Open(fifo, TokenFileFormat::kUint16);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(f.status().message().find("is a FIFO"), std::string::npos) << f.status();
  EXPECT_FALSE(TokenFile::Open("/dev/zero", TokenFileFormat::kUint16).ok());
}

TEST(TokenFileTest, WindowsOverConcatenatedFilesEqualWindowsOverMemory) {
  std::vector<uint16_t> a(517), b(301);
  std::vector<int32_t> all;
  for (size_t i = 0; i < a.size(); ++i)
    all.push_back(a[i] = static_cast<uint16_t>((i * 37) % 1000));
  for (size_t i = 0; i < b.size(); ++i) all.push_back(b[i] = static_cast<uint16_t>((i * 11) % 997));
  auto files = TokenFiles::Open({WriteTokens("c1.u16", a, 0), WriteTokens("c2.u16", b, 0)},
                                TokenFileFormat::kUint16);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(files->size(), all.size());
  EXPECT_EQ(*files->MaxToken(), 999);
  auto mapped = TokenWindows::Create(std::make_shared<TokenFiles>(std::move(*files)), 13, 0.1, 5);
  auto memory = TokenWindows::Create(all, 13, 0.1, 5);
  ASSERT_TRUE(mapped.ok() && memory.ok());
  for (int i = 0; i < 90; ++i) {  // past one epoch: the reshuffle is the same too
    const WindowBatch x = *mapped->NextTrainBatch(3), y = *memory->NextTrainBatch(3);
    ASSERT_EQ(x.inputs, y.inputs);
    ASSERT_EQ(x.targets, y.targets);
  }
  EXPECT_EQ(mapped->ValidationBatch(0, 4)->inputs, memory->ValidationBatch(0, 4)->inputs);
}

}  // namespace
}  // namespace megatrain::engine
