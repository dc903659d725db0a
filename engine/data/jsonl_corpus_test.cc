// Tests for the strict JSONL corpus reader and extension dispatch in LoadTextDocuments.
#include "engine/data/jsonl_corpus.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "engine/data/text_corpus.h"

namespace megatrain::engine {
namespace {

using ::testing::HasSubstr;

TEST(JsonlCorpusTest, ReadsTextFieldsInOrder) {
  absl::StatusOr<std::vector<std::string>> docs = ParseJsonlDocuments(
      "{\"text\": \"one\\ntwo\"}\r\n"
      "{\"id\": 7, \"text\": \"caf\\u00e9\", \"meta\": {\"k\": [1]}}\n"
      "{\"text\": \"\"}\n"
      "  {\"text\":\"last\"}  ",
      "c.jsonl");
  ASSERT_TRUE(docs.ok()) << docs.status();
  EXPECT_EQ(*docs, (std::vector<std::string>{"one\ntwo", "caf\xC3\xA9", "last"}));
}

void ExpectError(const std::string& content, const std::string& where, const std::string& what) {
  absl::StatusOr<std::vector<std::string>> docs = ParseJsonlDocuments(content, "bad.jsonl");
  ASSERT_FALSE(docs.ok()) << content;
  EXPECT_EQ(docs.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(docs.status().message()), HasSubstr(where)) << content;
  EXPECT_THAT(std::string(docs.status().message()), HasSubstr(what)) << content;
}

TEST(JsonlCorpusTest, ErrorsNameFileAndLine) {
  const std::string ok = "{\"text\": \"fine\"}\n";
  ExpectError(ok + "not json\n", "bad.jsonl:2:", "invalid JSON");
  ExpectError(ok + ok + "[\"text\"]\n", "bad.jsonl:3:", "expected an object");
  ExpectError("\"just a string\"\n", "bad.jsonl:1:", "expected an object");
  ExpectError(ok + "{\"txt\": \"typo\"}\n", "bad.jsonl:2:", "no \"text\"");
  ExpectError(ok + "{\"text\": 42}\n", "bad.jsonl:2:", "not a string");
  ExpectError(ok + "{\"text\": null}\n", "bad.jsonl:2:", "not a string");
  ExpectError(ok + "\n" + ok, "bad.jsonl:2:", "blank line");
  ExpectError(ok + ok + ok + ok + "{\"text\": \"a\"} trailing\n", "bad.jsonl:5:", "invalid JSON");
  ExpectError("{\"text\": \"a\", \"text\": \"b\"}\n", "bad.jsonl:1:", "");
  ExpectError("{\"text\": \"a\"\n}\n", "bad.jsonl:1:", "invalid JSON");
}

TEST(JsonlCorpusTest, LoadTextDocumentsReadsJsonlByExtension) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/jsonl_corpus";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/a.jsonl") << "{\"text\": \"from jsonl\"}\n{\"text\": \"second\"}\n";
  std::ofstream(dir + "/b.txt") << "fortune one\n%\nfortune two\n";
  absl::StatusOr<std::vector<std::string>> docs = LoadTextDocuments({dir});
  ASSERT_TRUE(docs.ok()) << docs.status();
  EXPECT_EQ(*docs,
            (std::vector<std::string>{"from jsonl", "second", "fortune one", "fortune two"}));

  std::ofstream(dir + "/c.jsonl") << "{\"text\": \"ok\"}\n{\"text\": 1}\n";
  absl::StatusOr<std::vector<std::string>> bad = LoadTextDocuments({dir});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr(dir + "/c.jsonl:2:"));
}

}  // namespace
}  // namespace megatrain::engine
