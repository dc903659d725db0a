// A job's MTSFT sample file from megatrain_chat_tokenize (see job_chat_samples.h).
#include "server/job_chat_samples.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "engine/common/safe_files.h"
#include "engine/provenance/lineage.h"
#include "engine/provenance/sha256.h"
#include "nlohmann/json.hpp"
#include "server/child_process.h"
#include "server/job_tokens.h"

namespace megatrain::server {
namespace {

// The tool's summary line, as kept in <key>.json.
struct Summary {
  uint64_t samples = 0;
  uint64_t tokens = 0;
  uint64_t counted_tokens = 0;
  int vocab_size = 0;
  int output_version = 0;
};

absl::StatusOr<Summary> ParseSummary(const std::string& text, const std::string& source) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto unsigned_field = [&j](const char* name) {
    return j.contains(name) && j[name].is_number_unsigned();
  };
  if (!j.is_object() || !unsigned_field("samples") || !unsigned_field("tokens") ||
      !unsigned_field("counted_tokens") || !unsigned_field("vocab_size")) {
    return absl::InternalError(absl::StrCat(
        source, ": not a megatrain_chat_tokenize summary: '", text.substr(0, 200), "'"));
  }
  Summary s{j["samples"].get<uint64_t>(), j["tokens"].get<uint64_t>(),
            j["counted_tokens"].get<uint64_t>(), j["vocab_size"].get<int>()};
  if (j.contains("output_version") && j["output_version"].is_number_integer()) {
    s.output_version = j["output_version"].get<int>();
  }
  return s;
}

// The size an MTSFT file of `s` has (header, offsets, ids, mask bytes).
uint64_t SampleFileBytes(const Summary& s) {
  return 32 + 8 * (s.samples + 1) + 5 * s.tokens;
}

// Whether only this daemon could have put files in `dir` (as job_tokens.cc: the key is a hash of
// public inputs, so a file found in a directory others may write to might be planted).
bool OnlyWeWriteInto(const std::string& dir) {
  struct stat st {};
  return ::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::geteuid() &&
         (st.st_mode & (S_IWGRP | S_IWOTH)) == 0;
}

absl::StatusOr<Summary> FindReusable(const std::string& dir, const std::string& stem) {
  if (!OnlyWeWriteInto(dir)) {
    return absl::NotFoundError(absl::StrCat(dir, " is writable by others: nothing is reused"));
  }
  absl::StatusOr<std::string> text = engine::ReadRegularFile(stem + ".json", 1 << 20);
  if (!text.ok()) return absl::NotFoundError(stem + ".json");
  absl::StatusOr<Summary> summary = ParseSummary(*text, stem + ".json");
  if (!summary.ok()) return summary.status();
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(stem + ".mtsft", ec);
  if (ec || size != SampleFileBytes(*summary)) {
    return absl::NotFoundError(absl::StrCat(stem, ".mtsft is missing or cut"));
  }
  return summary;
}

// The tokenizer files of the directory that exist (held ones only, with a set of inputs).
std::vector<std::string> PresentTokenizerFiles(const ChatSamplesRequest& request) {
  std::vector<std::string> present;
  for (const char* name : kChatTokenizerFileNames) {
    const std::string path = absl::StrCat(request.model_dir, "/", name);
    std::error_code ec;
    if (request.inputs != nullptr ? request.inputs->Has(path)
                                  : std::filesystem::is_regular_file(path, ec)) {
      present.push_back(name);
    }
  }
  return present;
}

// --input_fds / --model_fds: the chat files and the tokenizer files as inherited descriptors of
// the checked inputs, matched by position and by name.
absl::Status AddHeldInputs(const ChatSamplesRequest& request, std::vector<std::string>& argv,
                           ChildOptions& options) {
  std::vector<int> fds;
  for (size_t i = 0; i < request.chat_paths.size(); ++i) {
    absl::StatusOr<int> fd = request.inputs->Descriptor(request.chat_paths[i]);
    if (!fd.ok()) {
      return absl::Status(fd.status().code(), absl::StrCat("data.chat_files[", i, "]: ",
                                                           fd.status().message()));
    }
    fds.push_back(*fd);
  }
  const std::vector<std::string> names = PresentTokenizerFiles(request);
  for (const std::string& name : names) {
    absl::StatusOr<int> fd = request.inputs->Descriptor(absl::StrCat(request.model_dir, "/", name));
    if (!fd.ok()) {
      return absl::Status(fd.status().code(),
                          absl::StrCat("model.hf_directory: ", fd.status().message()));
    }
    fds.push_back(*fd);
  }
  options.pass_fds = ChildFdNumbers(fds);
  std::vector<std::string> data_fds;
  std::vector<std::string> model_fds;
  for (size_t i = 0; i < fds.size(); ++i) {
    const int child = options.pass_fds[i].second;
    if (i < request.chat_paths.size()) {
      data_fds.push_back(absl::StrCat(child));
    } else {
      model_fds.push_back(absl::StrCat(names[i - request.chat_paths.size()], "=", child));
    }
  }
  argv.push_back(absl::StrCat("--input_fds=", absl::StrJoin(data_fds, ",")));
  argv.push_back(absl::StrCat("--model_fds=", absl::StrJoin(model_fds, ",")));
  return absl::OkStatus();
}

std::string Trimmed(const std::string& text) {
  return std::string(absl::StripAsciiWhitespace(text));
}

// Runs the tool into <stem>.mtsft and returns its summary line.
absl::StatusOr<std::string> RunTool(const ChatSamplesRequest& request, const std::string& stem,
                                    const std::function<bool()>& should_stop) {
  if (access(request.tool.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "chat_tokenize_binary '", request.tool, "' cannot be run (", std::strerror(errno),
        "): scripts/install puts it beside megatraind (<prefix>/bin/megatrain_chat_tokenize, "
        "the default); from a checkout give megatraind --chat_tokenize_binary=<checkout>/"
        "tools/hf_chat/megatrain_chat_tokenize after scripts/setup (docs/daemon.md)"));
  }
  std::vector<std::string> argv = {request.tool, absl::StrCat("--model=", request.model_dir),
                                   absl::StrCat("--out=", stem, ".mtsft"),
                                   absl::StrCat("--format=", request.format)};
  ChildOptions options;
  if (request.inputs != nullptr) {
    if (absl::Status s = AddHeldInputs(request, argv, options); !s.ok()) return s;
  }
  argv.push_back("--");  // names that start with '-' stay names
  argv.insert(argv.end(), request.chat_paths.begin(), request.chat_paths.end());
  absl::StatusOr<ChildResult> child = RunChildProcess(argv, should_stop, options);
  if (!child.ok()) {
    if (child.status().code() == absl::StatusCode::kCancelled) {
      return absl::CancelledError("stopped while tokenizing the chat files");
    }
    return absl::FailedPreconditionError(
        absl::StrCat("chat_tokenize_binary: ", child.status().message()));
  }
  if (child->exit_code == 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.chat_files: bad lines: ", Trimmed(child->err)));
  }
  if (child->exit_code == 2) {  // usage, the model directory, the venv, I/O
    return absl::FailedPreconditionError(
        absl::StrCat("chat_tokenize_binary '", request.tool, "' failed: ", Trimmed(child->err)));
  }
  if (child->exit_code != 0) {
    return absl::InternalError(absl::StrCat(
        "chat_tokenize_binary '", request.tool, "' ",
        child->exit_code < 0 ? absl::StrCat("was killed by signal ", child->term_signal)
                             : absl::StrCat("exited with ", child->exit_code),
        ": ", Trimmed(child->err)));
  }
  return Trimmed(child->out);
}

}  // namespace

std::string DefaultChatTokenizeBinary() {
  return BesideThisExecutable("megatrain_chat_tokenize");
}

absl::StatusOr<std::string> ChatSamplesKey(const ChatSamplesRequest& request) {
  provenance::Sha256 hasher;
  hasher.Update(absl::StrCat("megatrain_chat_tokenize output ", kChatTokenizeOutputVersion,
                             "\nformat ", request.format, "\n"));
  for (const std::string& name : PresentTokenizerFiles(request)) {
    absl::StatusOr<std::vector<provenance::InputFile>> hashed = provenance::HashInputs(
        provenance::kRoleTokenizer, {absl::StrCat(request.model_dir, "/", name)}, request.inputs);
    if (!hashed.ok()) return hashed.status();
    hasher.Update(absl::StrCat("tokenizer ", name, " ", hashed->at(0).sha256_hex, "\n"));
  }
  absl::StatusOr<std::vector<provenance::InputFile>> data =
      provenance::HashInputs(provenance::kRoleData, request.chat_paths, request.inputs);
  if (!data.ok()) return data.status();
  for (const provenance::InputFile& f : *data) hasher.Update(absl::StrCat("data ", f.sha256_hex, "\n"));
  return hasher.FinalHex();
}

absl::StatusOr<ChatSamples> PrepareChatSamples(const ChatSamplesRequest& request,
                                               const std::function<bool()>& should_stop) {
  if (absl::Status s = engine::MakeDirectories(request.tokens_dir); !s.ok()) {
    return absl::PermissionDeniedError(absl::StrCat("token directory: ", s.message()));
  }
  absl::StatusOr<std::string> key = ChatSamplesKey(request);
  if (!key.ok()) return key.status();
  const std::string stem = absl::StrCat(request.tokens_dir, "/", *key);
  ChatSamples result;
  result.key = *key;
  absl::StatusOr<Summary> summary = FindReusable(request.tokens_dir, stem);
  result.reused = summary.ok();
  if (!summary.ok()) {
    absl::StatusOr<std::string> line = RunTool(request, stem, should_stop);
    if (!line.ok()) return line.status();
    summary = ParseSummary(*line, request.tool);
    if (!summary.ok()) return summary.status();
    std::error_code ec;
    if (summary->output_version != kChatTokenizeOutputVersion) {
      std::filesystem::remove(stem + ".mtsft", ec);
      return absl::InternalError(absl::StrCat(
          "chat_tokenize_binary '", request.tool, "' writes output version ",
          summary->output_version, " but this daemon expects ", kChatTokenizeOutputVersion,
          ": use the tool of the same checkout as megatraind"));
    }
    nlohmann::json kept = nlohmann::json::parse(*line);
    kept["out"] = stem + ".mtsft";
    if (absl::Status s =
            engine::WriteFileInDirectory(request.tokens_dir, *key + ".json", kept.dump() + "\n");
        !s.ok()) {
      return absl::PermissionDeniedError(absl::StrCat("sample report: ", s.message()));
    }
  }
  result.path = stem + ".mtsft";
  result.samples = summary->samples;
  result.tokens = summary->tokens;
  result.counted_tokens = summary->counted_tokens;
  result.vocab_size = summary->vocab_size;
  if (result.vocab_size > request.model_vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.chat_files: the tokenizer of '", request.model_dir, "' gives ids up to ",
        result.vocab_size - 1, ", outside the model's vocab_size ", request.model_vocab_size));
  }
  return result;
}

absl::StatusOr<std::string> LinkChatSamples(const ChatSamples& samples,
                                            const std::string& job_id) {
  return LinkJobFile(samples.path, job_id, "mtsft");
}

}  // namespace megatrain::server
