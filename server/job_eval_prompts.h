// A daemon job's data.eval_prompts through the chat tool (tools/hf_chat's megatrain_chat_tokenize
// --render_prompts / --decode_lists) as a child process that reads the model directory's
// tokenizer files through the descriptors the daemon checked: the prompts are rendered with the
// chat template once when the job's run starts, and each evaluation's replies are decoded in one
// process; and the one-line form of a reply that the job's events carry.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/common/input_files.h"
#include "engine/train/training_run.h"
#include "proto/megatrain.pb.h"

namespace megatrain::server {

// Where the chat tool reads a model directory: `inputs` (not owned) holds its checked files, or
// is null and the tool opens the paths.
struct EvalPromptTool {
  std::string tool;       // path of megatrain_chat_tokenize
  std::string model_dir;  // model.hf_directory (resolved)
  const engine::InputFiles* inputs = nullptr;
};

struct RenderedEvalPrompts {
  std::vector<engine::EvalPrompt> prompts;  // the texts with their ids, in order
  std::vector<int32_t> stop_ids;            // eos / end-of-turn ids
  int64_t vocab_size = 0;                   // the tokenizer's, added tokens included
};

// Renders every prompt as one user turn with the generation prompt. Errors name
// data.eval_prompts (a template that refuses a prompt, a bad tool output) or the tool
// (FAILED_PRECONDITION when it cannot run); CANCELLED once `should_stop` says so.
absl::StatusOr<RenderedEvalPrompts> RenderEvalPrompts(const EvalPromptTool& tool,
                                                      const std::vector<std::string>& prompts,
                                                      const std::function<bool()>& should_stop);

// Fills each reply's text from its ids (special tokens skipped), all in one process.
absl::Status DecodeEvalReplies(const EvalPromptTool& tool,
                               std::vector<engine::EvalReplyReport>& replies,
                               const std::function<bool()>& should_stop);

// What a job's events carry of a reply.
v1::EvalReply ToEvalReply(uint64_t step, const engine::EvalReplyReport& reply);

// `eval step 20 [1] "prompt" -> "reply"` (index from 1, as a user counts): both quoted with
// backslash escapes for quotes, backslashes and control characters, the prompt cut after
// kEvalLinePromptBytes and the reply after kEvalLineReplyBytes (never inside a UTF-8 character,
// "..." marking the cut); " (length limit)" when the reply did not end by itself.
inline constexpr size_t kEvalLinePromptBytes = 60;
inline constexpr size_t kEvalLineReplyBytes = 400;
std::string EvalReplyLine(const v1::EvalReply& reply);

}  // namespace megatrain::server
