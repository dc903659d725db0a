// ForEachTextDocument: a text corpus's documents one at a time, read line by line, so that
// tokenizing a corpus needs memory for one document, not for the corpus (issue 16, point 6).
// The documents and their order are LoadTextDocuments' (text_corpus.h), which is built on it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/common/input_files.h"

namespace megatrain::engine {

// Lines of a regular file read with pread through a fixed buffer, split at '\n' as
// std::getline splits them (a final newline does not start an empty line). The descriptor is
// not owned and its offset is never used. Errors name `path` and the byte offset.
class FileLineReader {
 public:
  FileLineReader(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  // The next line into `line` (without '\n'); false at the end of the file.
  absl::StatusOr<bool> Next(std::string* line);

 private:
  int fd_;
  std::string path_;
  std::string buffer_;
  size_t buffer_pos_ = 0;
  uint64_t file_offset_ = 0;  // of the byte after buffer_
  bool eof_ = false;
};

struct TextDocumentOptions {
  bool jsonl_by_extension = true;  // *.jsonl files are JSON Lines (jsonl_corpus.h)
  // Null: each file is opened by path (regular files only). Otherwise every file is read from
  // its checked descriptor and a file that was not checked is refused.
  const InputFiles* inputs = nullptr;
};

// Calls `each` with every document of ExpandCorpusFiles(paths), in order; stops at the first
// error (its own or one `each` returns). Returns the number of documents; none at all is
// INVALID_ARGUMENT "text files contain no documents".
absl::StatusOr<uint64_t> ForEachTextDocument(
    const std::vector<std::string>& paths, const TextDocumentOptions& options,
    const std::function<absl::Status(std::string_view document)>& each);

}  // namespace megatrain::engine
