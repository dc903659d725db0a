// A daemon job's chat / instruction JSONL turned into an MTSFT sample file out of process:
// tools/hf_chat's megatrain_chat_tokenize (Python, with the model directory's own HF tokenizer
// and chat template) reads the job's chat files and the directory's tokenizer files through
// inherited descriptors of what the daemon checked, and writes the file into the job's tokens
// directory under a content key; a later run (a resume, a restarted daemon) reuses it.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/common/input_files.h"

namespace megatrain::server {

// The output version of megatrain_chat_tokenize this daemon expects (its OUTPUT_VERSION).
inline constexpr int kChatTokenizeOutputVersion = 1;

// The files of an HF model directory the chat tool reads, in the key's order.
inline constexpr std::array<const char*, 5> kChatTokenizerFileNames = {
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
    "generation_config.json"};

// megatrain_chat_tokenize beside the running executable (a link to
// tools/hf_chat/megatrain_chat_tokenize of a checkout where scripts/setup made the venv).
std::string DefaultChatTokenizeBinary();

struct ChatSamplesRequest {
  std::string tool;                     // path of megatrain_chat_tokenize
  std::string model_dir;                // model.hf_directory (resolved)
  std::vector<std::string> chat_paths;  // data.chat_files (resolved), in order
  std::string format;                   // "auto", "chat", "prompt_completion" or "alpaca"
  std::string tokens_dir;               // created when missing
  int model_vocab_size = 0;             // the samples' ids must fit in it
  // The job's checked inputs (not owned; null = the tool opens the paths). When set, the chat
  // files and the directory's tokenizer files are handed over as inherited descriptors
  // (--input_fds, --model_fds) and hashed through them.
  const engine::InputFiles* inputs = nullptr;
};

struct ChatSamples {
  std::string path;  // <tokens_dir>/<key>.mtsft
  std::string key;
  uint64_t samples = 0;
  uint64_t tokens = 0;
  uint64_t counted_tokens = 0;  // mask bytes that are 1
  int vocab_size = 0;
  bool reused = false;  // found from an earlier run; no process was started
};

// Lower-case hex SHA-256 over the tool's output version, the format, the tokenizer files'
// (name, hash) and the chat files' hashes in order.
absl::StatusOr<std::string> ChatSamplesKey(const ChatSamplesRequest& request);

// Returns the job's sample file: reused when <key>.json (the tool's summary, kept beside it) and
// the file it describes are whole; otherwise runs the tool (killed, CANCELLED, once
// `should_stop` says so) into <key>.mtsft and writes <key>.json. Errors: FAILED_PRECONDITION
// when the tool is missing or cannot run (no venv: its message), INVALID_ARGUMENT starting
// "data.chat_files" with the tool's FILE:LINE messages for bad lines, INVALID_ARGUMENT naming
// both sizes when the ids exceed the model's vocabulary, INTERNAL for a crash or another output
// version.
absl::StatusOr<ChatSamples> PrepareChatSamples(const ChatSamplesRequest& request,
                                               const std::function<bool()>& should_stop);

// Points <tokens_dir>/<job_id>.mtsft at `samples` (atomically) and returns the link: the stable
// name a job's checkpoints record.
absl::StatusOr<std::string> LinkChatSamples(const ChatSamples& samples, const std::string& job_id);

}  // namespace megatrain::server
