// The files of a Hugging Face model directory that are not the model but travel with it: the
// tokenizer (tokenizer.json, tokenizer_config.json with its chat template, special tokens, a
// SentencePiece or BPE vocabulary), chat_template.jinja and generation_config.json. A run that
// starts from an HF model copies them into every checkpoint, so each checkpoint loads in
// `transformers` (or vLLM) with the tokenizer and template the model was trained with.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/common/input_files.h"

namespace megatrain::engine {

// Each file at most this large (a 256k-vocabulary tokenizer.json is about 30 MB).
inline constexpr uint64_t kMaxHfCompanionFileBytes = uint64_t{64} << 20;

struct HfCompanionFile {
  std::string name;   // as in the directory, e.g. "tokenizer.json"
  std::string bytes;  // the whole file
};

// True for the names above (exact names; no paths).
bool IsHfCompanionFileName(std::string_view name);

// The companion files present in `dir`, in a fixed order, each read whole. Absent ones are
// skipped; a present one that is not a regular file or is over the cap is an error naming it.
// With `inputs` (a daemon's run) only the files the daemon checked and holds are read, through
// their descriptors; without, the path is opened as a regular file (tools on the user's files).
absl::StatusOr<std::vector<HfCompanionFile>> ReadHfCompanionFiles(const std::string& dir,
                                                                  const InputFiles* inputs);

}  // namespace megatrain::engine
