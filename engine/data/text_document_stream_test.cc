// ForEachTextDocument yields exactly the documents of the whole-file readers (SplitFortunes,
// ParseJsonlDocuments) for fortune, plain and JSONL files, across read-buffer boundaries, with
// and without a final newline; FileLineReader splits lines as std::getline does.
#include "engine/data/text_document_stream.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/common/safe_files.h"
#include "engine/data/jsonl_corpus.h"
#include "engine/data/text_corpus.h"

namespace megatrain::engine {
namespace {

using ::testing::HasSubstr;

std::string Tmp(const std::string& name) { return std::string(getenv("TEST_TMPDIR")) + "/" + name; }

std::string Write(const std::string& name, const std::string& content) {
  const std::string path = Tmp(name);
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

std::vector<std::string> Stream(const std::vector<std::string>& paths) {
  std::vector<std::string> docs;
  absl::StatusOr<uint64_t> n = ForEachTextDocument(paths, {}, [&docs](std::string_view d) {
    docs.emplace_back(d);
    return absl::OkStatus();
  });
  EXPECT_TRUE(n.ok()) << n.status();
  if (n.ok()) {
    EXPECT_EQ(*n, docs.size());
  }
  return docs;
}

std::vector<std::string> GetlineLines(const std::string& content) {
  std::vector<std::string> lines;
  std::istringstream in(content);
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

TEST(FileLineReaderTest, SplitsAsGetlineAcrossBufferBoundaries) {
  // Lines around the 1 MiB read size, one longer than it, and the file's last line with and
  // without a newline.
  const std::string long_line(3 << 20, 'x');
  for (const std::string& content :
       {std::string(), std::string("\n"), std::string("a"), std::string("a\n\nb"),
        std::string((1 << 20) - 1, 'y') + "\nz\n", std::string(1 << 20, 'y') + "\n\n",
        long_line + "\nend", "first\n" + long_line + "\n"}) {
    const std::string path = Write("lines.txt", content);
    absl::StatusOr<UniqueFd> fd = OpenRegularFileForRead(path);
    ASSERT_TRUE(fd.ok()) << fd.status();
    FileLineReader reader(fd->get(), path);
    std::vector<std::string> lines;
    std::string line;
    while (true) {
      absl::StatusOr<bool> more = reader.Next(&line);
      ASSERT_TRUE(more.ok()) << more.status();
      if (!*more) break;
      lines.push_back(line);
    }
    EXPECT_EQ(lines, GetlineLines(content)) << "content of " << content.size() << " bytes";
  }
}

TEST(TextDocumentStreamTest, FortunesMatchSplitFortunes) {
  const std::string content = "one\n%\n\n%\ntwo\nlines\n\n\n%\n%\nthree without newline";
  const std::string path = Write("fortunes", content);
  EXPECT_EQ(Stream({path}), SplitFortunes(content));
}

TEST(TextDocumentStreamTest, JsonlMatchesParseJsonlDocuments) {
  const std::string content =
      "{\"text\": \"a\"}\r\n{\"text\": \"\"}\n{\"text\": \"b\\nc\", \"id\": 3}\n{\"text\": \"d\"}";
  const std::string path = Write("docs.jsonl", content);
  absl::StatusOr<std::vector<std::string>> whole = ParseJsonlDocuments(content, path);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(Stream({path}), *whole);
  EXPECT_EQ(Stream({path}), (std::vector<std::string>{"a", "b\nc", "d"}));
}

TEST(TextDocumentStreamTest, ADirectoryOfMixedFilesMatchesLoadTextDocuments) {
  ASSERT_TRUE(MakeDirectories(Tmp("mixed")).ok());
  Write("mixed/b.txt", "plain paragraph\n\nsecond paragraph\n");
  Write("mixed/a.jsonl", "{\"text\": \"json one\"}\n{\"text\": \"json two\"}\n");
  Write("mixed/c", std::string(5 << 20, 'q') + "\n%\nlast\n");
  absl::StatusOr<std::vector<std::string>> loaded = LoadTextDocuments({Tmp("mixed")});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->size(), 5u);
  EXPECT_EQ(Stream({Tmp("mixed")}), *loaded);
}

TEST(TextDocumentStreamTest, ErrorsNameTheFileAndLine) {
  const std::string path = Write("bad.jsonl", "{\"text\": \"ok\"}\n\n");
  absl::StatusOr<uint64_t> n =
      ForEachTextDocument({path}, {}, [](std::string_view) { return absl::OkStatus(); });
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(n.status().message(), HasSubstr("bad.jsonl:2: blank line"));

  const std::string empty = Write("empty.txt", "\n\n%\n");
  n = ForEachTextDocument({empty}, {}, [](std::string_view) { return absl::OkStatus(); });
  ASSERT_FALSE(n.ok());
  EXPECT_THAT(n.status().message(), HasSubstr("no documents"));

  const std::string fifo = Tmp("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  n = ForEachTextDocument({fifo}, {}, [](std::string_view) { return absl::OkStatus(); });
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(n.status().message(), HasSubstr("FIFO"));
}

TEST(TextDocumentStreamTest, AnErrorFromTheCallerStopsTheStream) {
  const std::string path = Write("three", "a\n%\nb\n%\nc\n");
  int seen = 0;
  absl::StatusOr<uint64_t> n = ForEachTextDocument({path}, {}, [&seen](std::string_view) {
    return ++seen == 2 ? absl::DataLossError("disk full") : absl::OkStatus();
  });
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(seen, 2);
}

TEST(TextDocumentStreamTest, HeldDescriptorsAreReadAndUncheckedFilesRefused) {
  const std::string path = Write("held.txt", "held content\n");
  InputFiles inputs;
  absl::StatusOr<UniqueFd> fd = OpenRegularFileForRead(path);
  ASSERT_TRUE(fd.ok());
  inputs.Add(path, *std::move(fd));
  // The path now names other content: the held descriptor is what is read.
  ASSERT_EQ(::unlink(path.c_str()), 0);
  Write("held.txt", "swapped\n");
  std::vector<std::string> docs;
  absl::StatusOr<uint64_t> n = ForEachTextDocument(
      {path}, TextDocumentOptions{true, &inputs}, [&docs](std::string_view d) {
        docs.emplace_back(d);
        return absl::OkStatus();
      });
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(docs, std::vector<std::string>{"held content"});

  const std::string other = Write("other.txt", "x\n");
  n = ForEachTextDocument({other}, TextDocumentOptions{true, &inputs},
                          [](std::string_view) { return absl::OkStatus(); });
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace megatrain::engine
