// Fortune-format corpus reader.
#include "engine/data/text_corpus.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/common/safe_files.h"
#include "engine/data/jsonl_corpus.h"

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
  absl::StatusOr<std::vector<std::string>> expanded = ExpandCorpusFiles(paths);
  if (!expanded.ok()) return expanded.status();
  std::vector<std::string> docs;
  for (const std::string& f : *expanded) {
    if (jsonl_by_extension && absl::EndsWith(f, ".jsonl")) {
      absl::StatusOr<std::vector<std::string>> lines = LoadJsonlDocuments(f, inputs);
      if (!lines.ok()) return lines.status();
      for (std::string& d : *lines) docs.push_back(std::move(d));
      continue;
    }
    // A regular file only: a FIFO or device would block or never end (issue 16, point 3).
    absl::StatusOr<std::string> text = ReadInputFile(inputs, f);
    if (!text.ok()) {
      return absl::Status(text.status().code() == absl::StatusCode::kInvalidArgument
                              ? absl::StatusCode::kInvalidArgument
                              : absl::StatusCode::kPermissionDenied,
                          absl::StrCat("cannot read text file: ", text.status().message()));
    }
    for (std::string& d : SplitFortunes(*text)) docs.push_back(std::move(d));
  }
  if (docs.empty()) {
    return absl::InvalidArgumentError("text files contain no documents");
  }
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
