// A job's eval prompts through the chat tool, and their event lines (see job_eval_prompts.h).
#include "server/job_eval_prompts.h"

#include <algorithm>
#include <climits>
#include <optional>


#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"
#include "server/child_process.h"
#include "server/job_chat_samples.h"

namespace megatrain::server {
namespace {

// Eight prompts of 1 KiB render to a few thousand ids; a round's replies are 8 x 512 at most.
constexpr size_t kMaxToolOutputBytes = 4 << 20;

// Runs the tool on the directory with `flags`; its stdout as a JSON object.
absl::StatusOr<nlohmann::json> RunTool(const EvalPromptTool& tool,
                                       const std::vector<std::string>& flags,
                                       const std::function<bool()>& should_stop) {
  std::vector<std::string> argv = {tool.tool, absl::StrCat("--model=", tool.model_dir)};
  ChildOptions options;
  options.max_output_bytes = kMaxToolOutputBytes;
  if (tool.inputs != nullptr) {
    // The directory's tokenizer files as the daemon checked them (as job_chat_samples.cc does).
    std::vector<std::string> names;
    std::vector<int> fds;
    for (const char* name : kChatTokenizerFileNames) {
      const std::string path = absl::StrCat(tool.model_dir, "/", name);
      if (!tool.inputs->Has(path)) continue;
      absl::StatusOr<int> fd = tool.inputs->Descriptor(path);
      if (!fd.ok()) {
        return absl::Status(fd.status().code(),
                            absl::StrCat("model.hf_directory: ", fd.status().message()));
      }
      names.push_back(name);
      fds.push_back(*fd);
    }
    options.pass_fds = ChildFdNumbers(fds);
    std::vector<std::string> held;
    for (size_t i = 0; i < names.size(); ++i) {
      held.push_back(absl::StrCat(names[i], "=", options.pass_fds[i].second));
    }
    argv.push_back(absl::StrCat("--model_fds=", absl::StrJoin(held, ",")));
  }
  argv.insert(argv.end(), flags.begin(), flags.end());
  absl::StatusOr<ChildResult> child = RunChildProcess(argv, should_stop, options);
  if (!child.ok()) {
    if (child.status().code() == absl::StatusCode::kCancelled) return child.status();
    return absl::FailedPreconditionError(
        absl::StrCat("chat_tokenize_binary: ", child.status().message()));
  }
  const std::string err(absl::StripAsciiWhitespace(child->err));
  if (child->exit_code != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "chat_tokenize_binary '", tool.tool, "' ",
        child->exit_code < 0 ? absl::StrCat("was killed by signal ", child->term_signal)
                             : absl::StrCat("exited with ", child->exit_code),
        ": ", err));
  }
  nlohmann::json value = nlohmann::json::parse(child->out, nullptr, /*allow_exceptions=*/false);
  if (!value.is_object()) {
    return absl::InternalError(absl::StrCat("chat_tokenize_binary '", tool.tool,
                                            "' printed no JSON object: '",
                                            child->out.substr(0, 200), "'"));
  }
  return value;
}

// A JSON list of token ids, or nullopt.
std::optional<std::vector<int32_t>> Ids(const nlohmann::json& value) {
  if (!value.is_array()) return std::nullopt;
  std::vector<int32_t> ids;
  for (const nlohmann::json& id : value) {
    if (!id.is_number_unsigned() || id.get<uint64_t>() > INT32_MAX) return std::nullopt;
    ids.push_back(static_cast<int32_t>(id.get<uint64_t>()));
  }
  return ids;
}

// `text` quoted: backslash escapes for '"', '\\' and control bytes; cut after `bound` bytes at a
// UTF-8 character boundary, "..." after the quote marking the cut.
std::string Quoted(const std::string& text, size_t bound) {
  std::string out = "\"";
  size_t end = std::min(text.size(), bound);
  while (end < text.size() && end > 0 && (static_cast<unsigned char>(text[end]) & 0xc0) == 0x80) {
    --end;  // never inside a character: back to its first byte
  }
  for (size_t i = 0; i < end; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '"' || c == '\\') {
      absl::StrAppend(&out, "\\", std::string(1, static_cast<char>(c)));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      absl::StrAppend(&out, absl::StrFormat("\\x%02x", c));
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  out += "\"";
  if (end < text.size()) out += "...";
  return out;
}

}  // namespace

absl::StatusOr<RenderedEvalPrompts> RenderEvalPrompts(const EvalPromptTool& tool,
                                                      const std::vector<std::string>& prompts,
                                                      const std::function<bool()>& should_stop) {
  const nlohmann::json list = prompts;
  absl::StatusOr<nlohmann::json> value =
      RunTool(tool, {"--render_prompts", list.dump()}, should_stop);
  if (!value.ok()) {
    if (value.status().code() == absl::StatusCode::kCancelled) {
      return absl::CancelledError("stopped while rendering data.eval_prompts");
    }
    return absl::Status(value.status().code(),
                        absl::StrCat("data.eval_prompts: ", value.status().message()));
  }
  const auto rendered = value->find("prompts");
  const auto stops = value->find("stop_ids");
  const auto vocab = value->find("vocab_size");
  std::optional<std::vector<int32_t>> stop_ids;
  if (stops != value->end()) stop_ids = Ids(*stops);
  if (rendered == value->end() || !rendered->is_array() || rendered->size() != prompts.size() ||
      !stop_ids.has_value() || vocab == value->end() || !vocab->is_number_unsigned()) {
    return absl::InternalError(absl::StrCat("data.eval_prompts: chat_tokenize_binary '",
                                            tool.tool, "' printed no prompts for them: '",
                                            value->dump().substr(0, 200), "'"));
  }
  RenderedEvalPrompts out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::optional<std::vector<int32_t>> ids = Ids((*rendered)[i]);
    if (!ids.has_value() || ids->empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.eval_prompts[", i, "]: the chat template renders it as no token ids"));
    }
    out.prompts.push_back({prompts[i], *std::move(ids)});
  }
  out.stop_ids = *std::move(stop_ids);
  out.vocab_size = vocab->get<int64_t>();
  return out;
}

absl::Status DecodeEvalReplies(const EvalPromptTool& tool,
                               std::vector<engine::EvalReplyReport>& replies,
                               const std::function<bool()>& should_stop) {
  nlohmann::json lists = nlohmann::json::array();
  for (const engine::EvalReplyReport& r : replies) lists.push_back(r.ids);
  absl::StatusOr<nlohmann::json> value =
      RunTool(tool, {"--decode_lists", lists.dump()}, should_stop);
  if (!value.ok()) return value.status();
  const auto texts = value->find("texts");
  if (texts == value->end() || !texts->is_array() || texts->size() != replies.size()) {
    return absl::InternalError(absl::StrCat("chat_tokenize_binary '", tool.tool,
                                            "' printed no texts for the replies: '",
                                            value->dump().substr(0, 200), "'"));
  }
  for (size_t i = 0; i < replies.size(); ++i) {
    if (!(*texts)[i].is_string()) {
      return absl::InternalError(absl::StrCat("chat_tokenize_binary '", tool.tool,
                                              "': texts[", i, "] is not a string"));
    }
    replies[i].text = (*texts)[i].get<std::string>();
  }
  return absl::OkStatus();
}

v1::EvalReply ToEvalReply(uint64_t step, const engine::EvalReplyReport& reply) {
  v1::EvalReply out;
  out.set_step(step);
  out.set_index(static_cast<uint32_t>(reply.index));
  out.set_prompt(reply.prompt);
  out.set_reply(reply.text);
  out.set_tokens(static_cast<uint32_t>(reply.ids.size()));
  out.set_stopped(reply.stopped);
  return out;
}

std::string EvalReplyLine(const v1::EvalReply& reply) {
  return absl::StrCat("eval step ", reply.step(), " [", reply.index() + 1, "] ",
                      Quoted(reply.prompt(), kEvalLinePromptBytes), " -> ",
                      Quoted(reply.reply(), kEvalLineReplyBytes),
                      reply.stopped() ? "" : " (length limit)");
}

}  // namespace megatrain::server
