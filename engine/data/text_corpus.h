// Reads text corpora into documents: fortune(6) files ("%" lines separate
// entries), plain files (blank-line paragraphs are kept together) and JSON
// Lines files (*.jsonl, see jsonl_corpus.h).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/common/input_files.h"
#include "engine/data/corpus_files.h"

namespace megatrain::engine {

// Splits a fortune-format file into its entries (the text between lines that
// consist of a single '%'); empty entries are dropped.
std::vector<std::string> SplitFortunes(const std::string& text);

// Loads every file of ExpandCorpusFiles(paths) (corpus_files.h) and returns the documents
// in a deterministic order (sorted by path, then file order).
absl::StatusOr<std::vector<std::string>> LoadFortuneDocuments(
    const std::vector<std::string>& paths);

// Like LoadFortuneDocuments, except that files named *.jsonl are read as
// JSON Lines (one {"text": ...} document per line, strictly). With `inputs` (a daemon's run),
// every file is read from its checked descriptor; a file that was not checked is refused.
absl::StatusOr<std::vector<std::string>> LoadTextDocuments(const std::vector<std::string>& paths,
                                                           const InputFiles* inputs = nullptr);

}  // namespace megatrain::engine
