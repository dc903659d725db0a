// Validation of fine-tuning data (see sft_data_validation.h).
#include "service/sft_data_validation.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "engine/common/safe_files.h"
#include "engine/data/sample_batches.h"
#include "engine/data/sample_set_file.h"
#include "nlohmann/json.hpp"
#include "service/spec_field_checks.h"

namespace megatrain::service {
namespace {

constexpr int kMaxSftFiles = 1024;                       // as text_files
constexpr uint64_t kMaxChatBytes = uint64_t{2} << 30;    // as text_files: 2 GiB a job may load
constexpr uint64_t kMaxTokenizerConfigBytes = 64 << 20;  // engine's companion-file cap
// data.eval_prompts: each evaluation generates a reply to every prompt, so few and short ones
// keep it a look at the model, not a second job; a reply re-runs the model once per token.
constexpr int kMaxEvalPrompts = 8;
constexpr size_t kMaxEvalPromptBytes = 1024;
constexpr uint32_t kMaxEvalReplyTokens = 512;

// The named files under the data roots, each a regular file; returns their resolved paths.
absl::StatusOr<std::vector<std::string>> ResolveFiles(
    const std::string& name, const google::protobuf::RepeatedPtrField<std::string>& files,
    const PathPolicy& paths, uint64_t* total_bytes) {
  if (files.size() > kMaxSftFiles) {
    return Invalid(name, absl::StrCat(files.size(), " entries exceed ", kMaxSftFiles));
  }
  std::vector<std::string> resolved;
  for (int i = 0; i < files.size(); ++i) {
    const std::string field = absl::StrCat(name, "[", i, "]");
    absl::StatusOr<std::string> path = paths.ResolveInput(field, files.Get(i));
    if (!path.ok()) return path.status();
    std::error_code ec;
    if (!std::filesystem::is_regular_file(*path, ec)) {
      return Invalid(field, absl::StrCat("'", *path, "' is not a regular file"));
    }
    *total_bytes += std::filesystem::file_size(*path, ec);
    resolved.push_back(*path);
  }
  return resolved;
}

// Whether the model directory has a chat template: tokenizer_config.json's chat_template or the
// file chat_template.jinja (the chat tokenizer's rule, docs/fine_tuning.md).
absl::StatusOr<bool> HasChatTemplate(const std::string& dir) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(dir + "/chat_template.jinja", ec)) return true;
  const std::string config_path = dir + "/tokenizer_config.json";
  if (!std::filesystem::exists(config_path, ec)) return false;
  absl::StatusOr<std::string> text = engine::ReadRegularFile(config_path, kMaxTokenizerConfigBytes);
  if (!text.ok()) return Invalid("model.hf_directory", text.status().message());
  const nlohmann::json config = nlohmann::json::parse(*text, nullptr, false);
  if (!config.is_object()) {
    return Invalid("model.hf_directory",
                   absl::StrCat("'", config_path, "' is not a JSON object"));
  }
  return config.contains("chat_template") && !config["chat_template"].is_null();
}

absl::Status ValidateChatFiles(const v1::DataSource& data, const PathPolicy& paths,
                               ValidatedJob& job) {
  const std::string format = data.chat_format().empty() ? "auto" : data.chat_format();
  if (format != "auto" && format != "chat" && format != "prompt_completion" &&
      format != "alpaca") {
    return Invalid("data.chat_format",
                   absl::StrCat("'", format.substr(0, 64),
                                "' is not auto, chat, prompt_completion or alpaca"));
  }
  const std::string& dir = job.options.init_from_hf_dir;
  if (dir.empty()) {
    return Invalid("data.chat_files",
                   "needs model.hf_directory: the chat files are tokenized with that "
                   "directory's tokenizer.json and chat template");
  }
  std::error_code ec;
  if (!std::filesystem::is_regular_file(dir + "/tokenizer.json", ec)) {
    return Invalid("model.hf_directory",
                   absl::StrCat("'", dir, "' has no tokenizer.json, which data.chat_files needs "
                                "(only fast Hugging Face tokenizers are supported)"));
  }
  absl::StatusOr<bool> has_template = HasChatTemplate(dir);
  if (!has_template.ok()) return has_template.status();
  if (!*has_template && format == "chat") {
    return Invalid("data.chat_format",
                   absl::StrCat("chat needs a chat template, and '", dir,
                                "' has none (no chat_template in tokenizer_config.json, no "
                                "chat_template.jinja); prompt_completion and alpaca lines "
                                "work without one (prompt + completion + EOS)"));
  }
  uint64_t total = 0;
  absl::StatusOr<std::vector<std::string>> files =
      ResolveFiles("data.chat_files", data.chat_files(), paths, &total);
  if (!files.ok()) return files.status();
  if (total > kMaxChatBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("data.chat_files: ", total, " bytes exceed the 2 GiB a job may load"));
  }
  job.chat_paths = *std::move(files);
  job.chat_format = format;
  return absl::OkStatus();
}

// Pre-made sample files: every header checked and the vocabulary against the model's, as the
// run will check them.
absl::Status ValidateSampleFiles(const v1::DataSource& data, const PathPolicy& paths,
                                 ValidatedJob& job) {
  if (!data.chat_format().empty()) {
    return Invalid("data.chat_format", "applies to data.chat_files only");
  }
  uint64_t total = 0;
  absl::StatusOr<std::vector<std::string>> files =
      ResolveFiles("data.sample_files", data.sample_files(), paths, &total);
  if (!files.ok()) return files.status();
  absl::StatusOr<engine::SampleSetFiles> sets = engine::SampleSetFiles::Open(*files);
  if (!sets.ok()) return Invalid("data.sample_files", sets.status().message());
  if (sets->vocab_bound() > static_cast<uint64_t>(job.model.vocab_size)) {
    return Invalid("data.sample_files",
                   absl::StrCat("hold token id ", sets->vocab_bound() - 1,
                                ", outside the model's vocab_size ", job.model.vocab_size));
  }
  job.options.sft_sample_paths = *std::move(files);
  return absl::OkStatus();
}

// data.eval_prompts / eval_reply_tokens: rendered with the model directory's chat template at
// run time, so they need the directory's tokenizer.json and a template.
absl::Status ValidateEvalPrompts(const v1::DataSource& data, ValidatedJob& job) {
  if (data.eval_prompts_size() == 0) {
    if (data.has_eval_reply_tokens()) {
      return Invalid("data.eval_reply_tokens", "applies with data.eval_prompts only");
    }
    return absl::OkStatus();
  }
  if (data.eval_prompts_size() > kMaxEvalPrompts) {
    return Invalid("data.eval_prompts", absl::StrCat(data.eval_prompts_size(),
                                                     " prompts exceed ", kMaxEvalPrompts));
  }
  for (int i = 0; i < data.eval_prompts_size(); ++i) {
    const std::string& prompt = data.eval_prompts(i);
    if (prompt.empty() || prompt.size() > kMaxEvalPromptBytes) {
      return Invalid(absl::StrCat("data.eval_prompts[", i, "]"),
                     absl::StrCat(prompt.size(), " bytes: a prompt holds 1 to ",
                                  kMaxEvalPromptBytes));
    }
  }
  const uint32_t reply_tokens =
      data.has_eval_reply_tokens() ? data.eval_reply_tokens() : kDefaultEvalReplyTokens;
  if (absl::Status s =
          CheckRange("data.eval_reply_tokens", reply_tokens, 1, kMaxEvalReplyTokens);
      !s.ok()) {
    return s;
  }
  const std::string& dir = job.options.init_from_hf_dir;
  if (dir.empty()) {
    return Invalid("data.eval_prompts",
                   "needs model.hf_directory: the prompts are rendered with its chat template");
  }
  std::error_code ec;
  if (!std::filesystem::is_regular_file(dir + "/tokenizer.json", ec)) {
    return Invalid("data.eval_prompts",
                   absl::StrCat("needs a tokenizer.json in model.hf_directory '", dir, "'"));
  }
  absl::StatusOr<bool> has_template = HasChatTemplate(dir);
  if (!has_template.ok()) return has_template.status();
  if (!*has_template) {
    return Invalid("data.eval_prompts",
                   absl::StrCat("needs a chat template, and model.hf_directory '", dir,
                                "' has none (no chat_template in tokenizer_config.json, no "
                                "chat_template.jinja)"));
  }
  job.eval_prompts.assign(data.eval_prompts().begin(), data.eval_prompts().end());
  job.eval_reply_tokens = static_cast<int>(reply_tokens);
  return absl::OkStatus();
}

}  // namespace

bool IsSftData(const v1::DataSource& data) {
  return data.chat_files_size() > 0 || data.sample_files_size() > 0;
}

absl::Status ValidateSftData(const v1::DataSource& data, const PathPolicy& paths,
                             ValidatedJob& job) {
  if (data.text_files_size() > 0 || data.token_files_size() > 0) {
    return Invalid(data.chat_files_size() > 0 ? "data.chat_files" : "data.sample_files",
                   "set one of text_files, token_files, chat_files or sample_files");
  }
  if (data.chat_files_size() > 0 && data.sample_files_size() > 0) {
    return Invalid("data.sample_files", "set either chat_files or sample_files, not both");
  }
  if (!data.tokenizer().empty()) {
    return Invalid("data.tokenizer",
                   "fine-tuning data uses model.hf_directory's tokenizer; leave it empty");
  }
  if (!data.token_format().empty()) {
    return Invalid("data.token_format", "applies to data.token_files only");
  }
  const std::string overlong = data.overlong().empty() ? "truncate" : data.overlong();
  if (!engine::ParseOverlongPolicy(overlong).ok()) {
    return Invalid("data.overlong",
                   absl::StrCat("'", overlong.substr(0, 64), "' is not truncate or refuse"));
  }
  job.options.overlong = overlong;
  job.options.pack = data.has_pack() ? data.pack() : true;
  job.options.train_on_prompt = data.train_on_prompt();
  absl::Status files = data.chat_files_size() > 0 ? ValidateChatFiles(data, paths, job)
                                                  : ValidateSampleFiles(data, paths, job);
  if (!files.ok()) return files;
  return ValidateEvalPrompts(data, job);
}

absl::Status RefuseSftOptions(const v1::DataSource& data) {
  if (!data.chat_format().empty()) {
    return Invalid("data.chat_format", "applies to data.chat_files only");
  }
  if (data.train_on_prompt()) {
    return Invalid("data.train_on_prompt", "applies to data.chat_files / sample_files only");
  }
  if (data.has_pack()) {
    return Invalid("data.pack", "applies to data.chat_files / sample_files only");
  }
  if (!data.overlong().empty()) {
    return Invalid("data.overlong", "applies to data.chat_files / sample_files only");
  }
  if (data.eval_prompts_size() > 0) {
    return Invalid("data.eval_prompts", "applies to data.chat_files / sample_files only");
  }
  if (data.has_eval_reply_tokens()) {
    return Invalid("data.eval_reply_tokens", "applies to data.chat_files / sample_files only");
  }
  return absl::OkStatus();
}

}  // namespace megatrain::service
