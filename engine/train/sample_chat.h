// `sample --chat`'s link to the HF chat tool (tools/hf_chat, megatrain_chat_tokenize --render /
// --decode), run as a child process so the engine never links Python: the model directory's chat
// template renders the user's prompt (add_generation_prompt) into token ids plus the ids that end
// a reply, and generated ids are decoded back to text by the same tokenizer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace megatrain::engine {

struct ChatPrompt {
  std::vector<int32_t> ids;       // the rendered conversation, up to the assistant header
  std::vector<int32_t> stop_ids;  // eos / end-of-turn ids: a reply ends at the first of them
};

// Runs argv (argv[0] a path, no shell, no PATH search), stdin /dev/null; its stdout when it exits
// 0, else an error naming argv[0], the exit and the first line(s) of its stderr.
absl::StatusOr<std::string> RunChatTool(const std::vector<std::string>& argv);

// One user turn rendered with `model_dir`'s chat template through `tool`.
absl::StatusOr<ChatPrompt> RenderChatPrompt(const std::string& tool, const std::string& model_dir,
                                            const std::string& user_prompt);

// A whole conversation, `conversation_json` = {"messages": [{"role", "content"}, ...]} (a chat
// JSONL line's shape: an optional system message, earlier turns, the user turn to answer),
// rendered with `model_dir`'s chat template through `tool`. Text that is not such an object is
// an InvalidArgument error naming `flag`; the tool checks each message.
absl::StatusOr<ChatPrompt> RenderChatConversation(const std::string& tool,
                                                  const std::string& model_dir,
                                                  const std::string& conversation_json,
                                                  const std::string& flag);

// `ids` as text (special tokens skipped) through `tool` and `model_dir`'s tokenizer.
absl::StatusOr<std::string> DecodeChatIds(const std::string& tool, const std::string& model_dir,
                                          absl::Span<const int32_t> ids);

}  // namespace megatrain::engine
