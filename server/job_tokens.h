// A daemon job's text tokenized out of process: megatrain_tokenize (engine/data) streams the job's
// text files into one token file with the byte tokenizer or its SentencePiece model, so the
// daemon never holds the corpus and SentencePiece (whose bundled protobuf clashes with the
// daemon's) never loads inside megatraind. The file is named by the
// SHA-256 of the tokenizer's and the data files' hashes and reused when present.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/common/input_files.h"
#include "engine/provenance/lineage.h"

namespace megatrain::server {

// megatrain_tokenize beside the running executable (/proc/self/exe's directory).
std::string DefaultTokenizeBinary();

// Lower-case hex SHA-256 naming a token file: over the tokenizer's output version
// (engine::kTokenizeOutputVersion in production), the tokenizer inputs' hashes, then the data
// inputs' hashes in order (other roles ignored). Same tool version and inputs, same name; any
// byte changed, the order changed or another output version, another name.
std::string TokenFileKey(int tokenize_output_version,
                         const std::vector<provenance::InputFile>& inputs);

struct JobTokensRequest {
  std::string tokenize_binary;          // path of megatrain_tokenize
  std::string tokenizer;                // SentencePiece .model (or "bytes")
  std::vector<std::string> text_paths;  // as the job lists them (files or directories)
  std::string tokens_dir;               // created when missing
  std::string key;                      // TokenFileKey of the job's inputs
  int output_version = 0;               // the version `key` was made with; the tool must report it
  int model_vocab_size = 0;             // the tokenizer's vocabulary must fit in it
  // The job's inputs as checked when it started (not owned; null = the tool opens the paths).
  // When set, the tool is given the text files (as engine::ExpandCorpusFiles lists them) and the
  // tokenizer model as inherited descriptors of these (--input_fds, --tokenizer_fd) and reads
  // them, never the paths (issue 16, point 2).
  const engine::InputFiles* inputs = nullptr;
};

struct JobTokens {
  std::string path;    // <tokens_dir>/<key>.u16 or .u32
  std::string format;  // "u16" or "u32" (engine/data/token_file.h)
  uint64_t tokens = 0;
  uint64_t documents = 0;  // as the tool counted them (0 from a report that lacks the field)
  int vocab_size = 0;
  bool reused = false;  // found from an earlier run; no process was started
};

// Returns the job's token file: reused when <tokens_dir>/<key>.json (megatrain_tokenize's report,
// kept beside it) and the token file it describes are present with the right size; otherwise
// runs the tool (RunChildProcess: CANCELLED once `should_stop` says so, the child killed) into
// <key>.part, renames it to <key>.<format> and writes <key>.json. Errors: the tool's stderr on
// its exit 1 (INVALID_ARGUMENT starting "data.tokenizer"), FAILED_PRECONDITION when it cannot
// run, INTERNAL for a usage error or a crash, or when the tool reports another output_version
// than the request's (a daemon and a megatrain_tokenize from different installs), nothing kept;
// INVALID_ARGUMENT naming both vocab sizes when the tokenizer's vocabulary exceeds the model's.
absl::StatusOr<JobTokens> PrepareJobTokens(const JobTokensRequest& request,
                                           const std::function<bool()>& should_stop);

// Points the symlink <tokens_dir>/<job_id>.<format> at `tokens` (atomically replacing an older
// link) and returns its path. A job trains on this stable name: the engine records the token
// file's path in the job its checkpoints must match, and after an allowed data change the
// content-addressed file has another name.
absl::StatusOr<std::string> LinkJobTokens(const JobTokens& tokens, const std::string& job_id);

// The same for any content-addressed file the daemon made for a job (token files, SFT sample
// sets): the symlink <dir of path>/<job_id>.<extension> -> basename(path), replaced atomically.
absl::StatusOr<std::string> LinkJobFile(const std::string& path, const std::string& job_id,
                                        const std::string& extension);

}  // namespace megatrain::server
