// The chat tool as a child process for `sample --chat` (see sample_chat.h).
#include "engine/train/sample_chat.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

extern char** environ;

namespace megatrain::engine {
namespace {

// The offset of the first byte that does not belong to a well-formed UTF-8 sequence (RFC 3629:
// no overlong forms, no surrogates, nothing above U+10FFFF), or npos.
size_t FirstInvalidUtf8(const std::string& text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
    const unsigned char lead = byte(i);
    size_t length = 0;
    unsigned char low = 0x80, high = 0xBF;  // the allowed range of the second byte
    if (lead < 0x80) {
      length = 1;
    } else if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      if (lead == 0xE0) low = 0xA0;
      if (lead == 0xED) high = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      if (lead == 0xF0) low = 0x90;
      if (lead == 0xF4) high = 0x8F;
    } else {
      return i;
    }
    if (i + length > text.size()) return i;
    for (size_t k = 1; k < length; ++k) {
      const unsigned char c = byte(i + k);
      if (k == 1 ? (c < low || c > high) : (c < 0x80 || c > 0xBF)) return i;
    }
    i += length;
  }
  return std::string::npos;
}

// Bounds what is kept of the tool's output: a reply's ids and text are far smaller.
constexpr size_t kMaxOutputBytes = 16 << 20;

// Reads both pipes until both close (poll, so a chatty stderr cannot block stdout).
void Drain(int out_fd, int err_fd, std::string* out, std::string* err) {
  pollfd fds[2] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
  std::string* sinks[2] = {out, err};
  int open = 2;
  char buffer[65536];
  while (open > 0) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t n = read(fds[i].fd, buffer, sizeof buffer);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        fds[i].fd = -1;
        --open;
        continue;
      }
      if (sinks[i]->size() < kMaxOutputBytes) sinks[i]->append(buffer, static_cast<size_t>(n));
    }
  }
}

absl::StatusOr<nlohmann::json> RunForJson(const std::vector<std::string>& argv) {
  absl::StatusOr<std::string> out = RunChatTool(argv);
  if (!out.ok()) return out.status();
  nlohmann::json value = nlohmann::json::parse(*out, nullptr, /*allow_exceptions=*/false);
  if (!value.is_object()) {
    return absl::InternalError(absl::StrCat(argv[0], " printed no JSON object: '",
                                            out->substr(0, 200), "'"));
  }
  return value;
}

absl::StatusOr<std::vector<int32_t>> Ids(const nlohmann::json& value, const char* field,
                                         const std::string& tool) {
  const auto it = value.find(field);
  if (it == value.end() || !it->is_array()) {
    return absl::InternalError(absl::StrCat(tool, ": field ", field, " is not a list"));
  }
  std::vector<int32_t> ids;
  for (const nlohmann::json& id : *it) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      return absl::InternalError(absl::StrCat(tool, ": field ", field, ": ", id.dump(),
                                              " is not a token id"));
    }
    ids.push_back(id.get<int32_t>());
  }
  return ids;
}

}  // namespace

absl::StatusOr<std::string> RunChatTool(const std::vector<std::string>& argv) {
  if (argv.empty()) return absl::InvalidArgumentError("no chat tool to run");
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) return absl::InternalError(std::strerror(errno));
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    close(out_pipe[0]);
    close(out_pipe[1]);
    return absl::InternalError(std::strerror(errno));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], 2);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out_pipe[1]);
  close(err_pipe[1]);
  std::string out, err;
  if (spawned == 0) Drain(out_pipe[0], err_pipe[0], &out, &err);
  close(out_pipe[0]);
  close(err_pipe[0]);
  if (spawned != 0) {
    return absl::FailedPreconditionError(absl::StrCat("--chat_tool=", argv[0],
                                                      " cannot be run: ", std::strerror(spawned)));
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    const std::string how = WIFEXITED(status) ? absl::StrCat("exited ", WEXITSTATUS(status))
                                              : absl::StrCat("died of signal ", WTERMSIG(status));
    while (!err.empty() && err.back() == '\n') err.pop_back();
    return absl::FailedPreconditionError(
        absl::StrCat(argv[0], " ", how, ": ", err.substr(0, 2000)));
  }
  return out;
}

absl::StatusOr<ChatPrompt> RenderChatPrompt(const std::string& tool, const std::string& model_dir,
                                            const std::string& user_prompt) {
  // nlohmann::json::dump throws on invalid UTF-8; the user gets the byte instead.
  if (const size_t bad = FirstInvalidUtf8(user_prompt); bad != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prompt is not valid UTF-8 (byte ", bad, " of ", user_prompt.size(), ")"));
  }
  nlohmann::json conversation;
  conversation["messages"] = {{{"role", "user"}, {"content", user_prompt}}};
  return RenderChatConversation(tool, model_dir, conversation.dump(), "--prompt");
}

absl::StatusOr<ChatPrompt> RenderChatConversation(const std::string& tool,
                                                  const std::string& model_dir,
                                                  const std::string& conversation_json,
                                                  const std::string& flag) {
  const nlohmann::json conversation =
      nlohmann::json::parse(conversation_json, nullptr, /*allow_exceptions=*/false);
  const bool has_messages = conversation.is_object() && conversation.contains("messages") &&
                            conversation.at("messages").is_array() &&
                            !conversation.at("messages").empty();
  if (!has_messages) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag,
        " must be a JSON object {\"messages\": [{\"role\": ..., \"content\": ...}, ...]} "
        "with at least one message, not '",
        conversation_json.substr(0, 120), "'"));
  }
  absl::StatusOr<nlohmann::json> value = RunForJson(
      {tool, "--model", model_dir, "--render", conversation.dump()});
  if (!value.ok()) return value.status();
  ChatPrompt prompt;
  absl::StatusOr<std::vector<int32_t>> ids = Ids(*value, "ids", tool);
  if (!ids.ok()) return ids.status();
  absl::StatusOr<std::vector<int32_t>> stops = Ids(*value, "stop_ids", tool);
  if (!stops.ok()) return stops.status();
  if (ids->empty()) return absl::InvalidArgumentError(absl::StrCat(
      model_dir, ": the chat template renders the prompt as no tokens"));
  prompt.ids = *std::move(ids);
  prompt.stop_ids = *std::move(stops);
  return prompt;
}

absl::StatusOr<std::string> DecodeChatIds(const std::string& tool, const std::string& model_dir,
                                          absl::Span<const int32_t> ids) {
  absl::StatusOr<nlohmann::json> value =
      RunForJson({tool, "--model", model_dir, "--decode", absl::StrJoin(ids, ",")});
  if (!value.ok()) return value.status();
  const auto text = value->find("text");
  if (text == value->end() || !text->is_string()) {
    return absl::InternalError(absl::StrCat(tool, ": field text is not a string"));
  }
  return text->get<std::string>();
}

}  // namespace megatrain::engine
