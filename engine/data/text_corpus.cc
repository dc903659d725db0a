// Fortune-format and JSONL corpora as documents (see text_corpus.h).
#include "engine/data/text_corpus.h"

#include <sstream>

#include "absl/status/status.h"
#include "engine/data/text_document_stream.h"

namespace megatrain::engine {

std::vector<std::string> SplitFortunes(const std::string& text) {
  std::vector<std::string> docs;
  std::string current;
  std::istringstream in(text);
  std::string line;
  auto flush = [&] {
    while (!current.empty() && current.back() == '\n') current.pop_back();
    if (!current.empty()) docs.push_back(current);
    current.clear();
  };
  while (std::getline(in, line)) {
    if (line == "%") {
      flush();
    } else {
      current += line;
      current += '\n';
    }
  }
  flush();
  return docs;
}

namespace {

absl::StatusOr<std::vector<std::string>> LoadDocuments(const std::vector<std::string>& paths,
                                                       bool jsonl_by_extension,
                                                       const InputFiles* inputs) {
  std::vector<std::string> docs;
  absl::StatusOr<uint64_t> count = ForEachTextDocument(
      paths, TextDocumentOptions{jsonl_by_extension, inputs}, [&docs](std::string_view d) {
        docs.emplace_back(d);
        return absl::OkStatus();
      });
  if (!count.ok()) return count.status();
  return docs;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> LoadFortuneDocuments(
    const std::vector<std::string>& paths) {
  return LoadDocuments(paths, /*jsonl_by_extension=*/false, nullptr);
}

absl::StatusOr<std::vector<std::string>> LoadTextDocuments(const std::vector<std::string>& paths,
                                                           const InputFiles* inputs) {
  return LoadDocuments(paths, /*jsonl_by_extension=*/true, inputs);
}

}  // namespace megatrain::engine
