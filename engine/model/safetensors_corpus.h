// A corpus of malformed .safetensors files, each with the error the reader must give.
#pragma once

#include <string>
#include <vector>

namespace megatrain::engine {

struct SafetensorsCorpusCase {
  std::string file_name;       // e.g. "bad_overlapping_offsets.safetensors"
  std::string bytes;           // the whole file
  std::string expected_error;  // substring of SafetensorsFile::Open's message
};

// Every case must be refused by SafetensorsFile::Open. The committed copies
// live in engine/model/testdata/safetensors_corpus/ (regenerate them with
// //engine/model:safetensors_corpus_gen).
std::vector<SafetensorsCorpusCase> MalformedSafetensorsCases();

// A file from a raw header text (length prefix added, no padding) and data.
std::string SafetensorsBytes(const std::string& header, const std::string& data);

}  // namespace megatrain::engine
