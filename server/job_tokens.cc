// A job's token file from megatrain_tokenize (see job_tokens.h).
#include "server/job_tokens.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "engine/common/safe_files.h"
#include "engine/data/corpus_files.h"
#include "engine/provenance/sha256.h"
#include "nlohmann/json.hpp"
#include "server/child_process.h"

namespace megatrain::server {
namespace {

// The tool's report, as kept in <key>.json.
struct ToolReport {
  uint64_t tokens = 0;
  int vocab_size = 0;
  std::string format;
  int output_version = 0;  // 0: a tool from before the field existed
  uint64_t documents = 0;
};

absl::StatusOr<ToolReport> ParseReport(const std::string& text, const std::string& source) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("tokens") || !j["tokens"].is_number_unsigned() ||
      !j.contains("vocab_size") || !j["vocab_size"].is_number_integer() || !j.contains("format") ||
      !j["format"].is_string()) {
    return absl::InternalError(
        absl::StrCat(source, ": not a megatrain_tokenize report: '", text.substr(0, 200), "'"));
  }
  ToolReport report{j["tokens"].get<uint64_t>(), j["vocab_size"].get<int>(),
                    j["format"].get<std::string>()};
  if (report.format != "u16" && report.format != "u32") {
    return absl::InternalError(absl::StrCat(source, ": unknown format '", report.format, "'"));
  }
  if (j.contains("output_version") && j["output_version"].is_number_integer()) {
    report.output_version = j["output_version"].get<int>();
  }
  if (j.contains("documents") && j["documents"].is_number_unsigned()) {
    report.documents = j["documents"].get<uint64_t>();
  }
  return report;
}

// The tool writes <key>.part through a temporary ".<key>.part.<random>.tmp" that it removes
// itself, unless it is killed (a cancelled job): then the daemon removes it.
void RemoveToolTemporaries(const std::string& tokens_dir, const std::string& key) {
  std::error_code ec;
  const std::string prefix = absl::StrCat(".", key, ".part.");
  for (const auto& entry : std::filesystem::directory_iterator(tokens_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, prefix) && absl::EndsWith(name, ".tmp")) {
      std::error_code ignored;
      std::filesystem::remove(entry.path(), ignored);
    }
  }
}

uint64_t TokenWidth(const std::string& format) { return format == "u16" ? 2 : 4; }

// The report of an earlier run whose token file is still whole; nullopt-like error otherwise.
// Whether only this daemon could have put files in `dir`: a real directory it owns that no
// group member or other user may write to. A token file found elsewhere might be planted (the
// key is a hash of public inputs), so it is never reused.
bool OnlyWeWriteInto(const std::string& dir) {
  struct stat st {};
  return ::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::geteuid() &&
         (st.st_mode & (S_IWGRP | S_IWOTH)) == 0;
}

absl::StatusOr<ToolReport> FindReusable(const std::string& dir, const std::string& report_path,
                                        const std::string& stem) {
  if (!OnlyWeWriteInto(dir)) {
    return absl::NotFoundError(absl::StrCat(dir, " is writable by others: nothing is reused"));
  }
  // A regular file only (a FIFO planted here would block the runner), and small.
  absl::StatusOr<std::string> text = engine::ReadRegularFile(report_path, 1 << 20);
  if (!text.ok()) return absl::NotFoundError(report_path);
  absl::StatusOr<ToolReport> report = ParseReport(*text, report_path);
  if (!report.ok()) return report.status();
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(stem + "." + report->format, ec);
  if (ec || size != report->tokens * TokenWidth(report->format)) {
    return absl::NotFoundError(absl::StrCat(stem, ".", report->format, " is missing or cut"));
  }
  return report;
}

// <dir>/<name> written atomically, never through a symlink planted in the directory.
absl::Status WriteReport(const std::string& dir, const std::string& name, const std::string& line) {
  if (absl::Status s = engine::WriteFileInDirectory(dir, name, line + "\n"); !s.ok()) {
    return absl::PermissionDeniedError(absl::StrCat("token report: ", s.message()));
  }
  return absl::OkStatus();
}

// The tool's arguments for reading the checked inputs: each text file and the tokenizer model
// passed as an inherited descriptor, matched to its name by position (--input_fds).
absl::Status AddHeldInputs(const JobTokensRequest& request, std::vector<std::string>& argv,
                           ChildOptions& options) {
  absl::StatusOr<std::vector<std::string>> files = engine::ExpandCorpusFiles(request.text_paths);
  if (!files.ok()) return files.status();
  std::vector<int> fds;
  for (const std::string& f : *files) {
    absl::StatusOr<int> fd = request.inputs->Descriptor(f);
    if (!fd.ok()) {
      return absl::Status(fd.status().code(),
                          absl::StrCat("data.text_files: ", fd.status().message()));
    }
    fds.push_back(*fd);
  }
  const bool model_file = request.tokenizer != "bytes";  // the byte tokenizer has no file
  if (model_file) {
    absl::StatusOr<int> tokenizer_fd = request.inputs->Descriptor(request.tokenizer);
    if (!tokenizer_fd.ok()) {
      return absl::Status(tokenizer_fd.status().code(),
                          absl::StrCat("data.tokenizer: ", tokenizer_fd.status().message()));
    }
    fds.push_back(*tokenizer_fd);
  }
  options.pass_fds = ChildFdNumbers(fds);
  std::vector<std::string> numbers;
  for (size_t i = 0; i < files->size(); ++i) {
    numbers.push_back(absl::StrCat(options.pass_fds[i].second));
  }
  argv.push_back(absl::StrCat("--input_fds=", absl::StrJoin(numbers, ",")));
  if (model_file) argv.push_back(absl::StrCat("--tokenizer_fd=", options.pass_fds.back().second));
  argv.push_back("--");  // names that start with '-' stay names
  argv.insert(argv.end(), files->begin(), files->end());
  return absl::OkStatus();
}

std::string Trimmed(const std::string& text) {
  return std::string(absl::StripAsciiWhitespace(text));
}

}  // namespace

std::string DefaultTokenizeBinary() { return BesideThisExecutable("megatrain_tokenize"); }

std::string TokenFileKey(int tokenize_output_version,
                         const std::vector<provenance::InputFile>& inputs) {
  provenance::Sha256 hasher;
  hasher.Update(absl::StrCat("megatrain_tokenize output ", tokenize_output_version, "\n"));
  for (const char* role : {provenance::kRoleTokenizer, provenance::kRoleData}) {
    for (const provenance::InputFile& f : inputs) {
      if (f.role == role) hasher.Update(absl::StrCat(role, " ", f.sha256_hex, "\n"));
    }
  }
  return hasher.FinalHex();
}

absl::StatusOr<JobTokens> PrepareJobTokens(const JobTokensRequest& request,
                                           const std::function<bool()>& should_stop) {
  std::error_code ec;
  if (absl::Status s = engine::MakeDirectories(request.tokens_dir); !s.ok()) {
    return absl::PermissionDeniedError(absl::StrCat("token directory: ", s.message()));
  }
  const std::string stem = absl::StrCat(request.tokens_dir, "/", request.key);
  const std::string report_path = stem + ".json";
  JobTokens tokens;
  absl::StatusOr<ToolReport> report = FindReusable(request.tokens_dir, report_path, stem);
  tokens.reused = report.ok();
  if (!report.ok()) {
    const std::string part = stem + ".part";
    std::vector<std::string> argv = {request.tokenize_binary,
                                     absl::StrCat("--tokenizer=", request.tokenizer),
                                     absl::StrCat("--out=", part), "--format=auto"};
    ChildOptions options;
    if (request.inputs == nullptr) {
      argv.insert(argv.end(), request.text_paths.begin(), request.text_paths.end());
    } else if (absl::Status s = AddHeldInputs(request, argv, options); !s.ok()) {
      return s;
    }
    absl::StatusOr<ChildResult> child = RunChildProcess(argv, should_stop, options);
    if (!child.ok() || child->exit_code != 0) RemoveToolTemporaries(request.tokens_dir, request.key);
    if (!child.ok()) {
      if (child.status().code() == absl::StatusCode::kCancelled) {
        return absl::CancelledError("stopped while tokenizing");
      }
      return absl::Status(child.status().code(),
                          absl::StrCat("tokenize_binary: ", child.status().message()));
    }
    if (child->exit_code == 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.tokenizer: tokenizing the data failed: ", Trimmed(child->err)));
    }
    if (child->exit_code != 0) {
      return absl::InternalError(absl::StrCat(
          "tokenize_binary '", request.tokenize_binary, "' ",
          child->exit_code < 0 ? absl::StrCat("was killed by signal ", child->term_signal)
                               : absl::StrCat("exited with ", child->exit_code),
          ": ", Trimmed(child->err)));
    }
    const std::string line = Trimmed(child->out);
    report = ParseReport(line, request.tokenize_binary);
    if (!report.ok()) return report.status();
    if (report->output_version != request.output_version) {
      std::filesystem::remove(part, ec);
      return absl::InternalError(absl::StrCat(
          "tokenize_binary '", request.tokenize_binary, "' writes output version ",
          report->output_version, " but this daemon expects ", request.output_version,
          ": install megatraind and megatrain_tokenize from the same build"));
    }
    const std::string path = stem + "." + report->format;
    if (std::rename(part.c_str(), path.c_str()) != 0) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot rename '", part, "' to '", path, "'"));
    }
    nlohmann::json kept = nlohmann::json::parse(line);
    kept["out"] = path;
    if (absl::Status s = WriteReport(request.tokens_dir, request.key + ".json", kept.dump());
        !s.ok()) {
      return s;
    }
  }
  tokens.path = stem + "." + report->format;
  tokens.format = report->format;
  tokens.tokens = report->tokens;
  tokens.documents = report->documents;
  tokens.vocab_size = report->vocab_size;
  if (tokens.vocab_size > request.model_vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.tokenizer: '", request.tokenizer, "' has vocab_size ", tokens.vocab_size,
                     ", more than the model's vocab_size ", request.model_vocab_size));
  }
  return tokens;
}

absl::StatusOr<std::string> LinkJobTokens(const JobTokens& tokens, const std::string& job_id) {
  return LinkJobFile(tokens.path, job_id, tokens.format);
}

absl::StatusOr<std::string> LinkJobFile(const std::string& path, const std::string& job_id,
                                        const std::string& extension) {
  const std::filesystem::path target(path);
  const std::string link = (target.parent_path() / (job_id + "." + extension)).string();
  const std::string tmp = link + ".tmp";
  std::error_code ec;
  std::filesystem::remove(tmp, ec);
  std::filesystem::create_symlink(target.filename(), tmp, ec);
  if (!ec) std::filesystem::rename(tmp, link, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot link '", link, "' to '", path, "': ", ec.message()));
  }
  return link;
}

}  // namespace megatrain::server
