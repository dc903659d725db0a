// The data part of job-spec validation (see data_spec_validation.h).
#include "service/data_spec_validation.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "engine/data/token_file.h"
#include "service/sft_data_validation.h"
#include "service/spec_field_checks.h"

namespace megatrain::service {
namespace {

// Bytes a text path will load: a file's size, or a directory's regular files (one level).
uint64_t InputBytes(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    uint64_t total = 0;
    for (const auto& entry : std::filesystem::directory_iterator(path, ec)) {
      if (entry.is_regular_file(ec)) total += entry.file_size(ec);
    }
    return total;
  }
  const uint64_t size = std::filesystem::file_size(path, ec);
  return ec ? 0 : size;
}

constexpr uint64_t kMaxTextBytes = uint64_t{2} << 30;
constexpr int kMaxTextFiles = 1024;

// Pre-tokenized data: each file opened (size, llm.c header) and its ids checked against the
// model's vocabulary (one pass over the mapped tokens, as the engine does before training).
absl::Status ValidateTokenFiles(const v1::DataSource& data, const PathPolicy& paths,
                                ValidatedJob& job) {
  if (data.text_files_size() > 0) {
    return Invalid("data.token_files", "set either token_files or text_files, not both");
  }
  if (!data.tokenizer().empty()) {
    return Invalid("data.tokenizer", "token files are already tokenized; leave it empty");
  }
  if (data.token_files_size() > kMaxTextFiles) {
    return Invalid("data.token_files",
                   absl::StrCat(data.token_files_size(), " entries exceed ", kMaxTextFiles));
  }
  const std::string format_name = data.token_format().empty() ? "u16" : data.token_format();
  absl::StatusOr<engine::TokenFileFormat> format = engine::ParseTokenFileFormat(format_name);
  if (!format.ok()) {
    return Invalid("data.token_format",
                   absl::StrCat("'", format_name.substr(0, 64), "' is not u16, u32 or llmc"));
  }
  for (int i = 0; i < data.token_files_size(); ++i) {
    const std::string field = absl::StrCat("data.token_files[", i, "]");
    absl::StatusOr<std::string> path = paths.ResolveInput(field, data.token_files(i));
    if (!path.ok()) return path.status();
    std::error_code ec;
    if (std::filesystem::is_directory(*path, ec)) {
      return Invalid(field, absl::StrCat("'", *path, "' is a directory; name the files"));
    }
    job.options.token_files.push_back(*path);
  }
  absl::StatusOr<engine::TokenFiles> files =
      engine::TokenFiles::Open(job.options.token_files, *format);
  if (!files.ok()) return Invalid("data.token_files", files.status().message());
  absl::StatusOr<int32_t> max_token = files->MaxToken();
  if (!max_token.ok()) return Invalid("data.token_files", max_token.status().message());
  if (*max_token >= job.model.vocab_size) {
    return Invalid("data.token_files",
                   absl::StrCat("hold token id ", *max_token, ", outside the model's vocab_size ",
                                job.model.vocab_size));
  }
  job.options.token_format = format_name;
  return absl::OkStatus();
}

absl::Status ValidateTextFiles(const v1::DataSource& data, const PathPolicy& paths,
                               ValidatedJob& job) {
  if (data.text_files_size() == 0) {
    return Invalid("data.text_files",
                   "at least one file (or data.token_files, chat_files or sample_files) is "
                   "required");
  }
  if (data.text_files_size() > kMaxTextFiles) {
    return Invalid("data.text_files",
                   absl::StrCat(data.text_files_size(), " entries exceed ", kMaxTextFiles));
  }
  if (!data.token_format().empty()) {
    return Invalid("data.token_format", "applies to data.token_files only");
  }
  uint64_t total = 0;
  for (int i = 0; i < data.text_files_size(); ++i) {
    const std::string field = absl::StrCat("data.text_files[", i, "]");
    absl::StatusOr<std::string> path = paths.ResolveInput(field, data.text_files(i));
    if (!path.ok()) return path.status();
    total += InputBytes(*path);
    job.options.text_paths.push_back(*path);
  }
  if (total > kMaxTextBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("data.text_files: ", total, " bytes exceed the 2 GiB a job may load"));
  }
  if (data.tokenizer().empty() && !job.options.init_from_hf_dir.empty()) {
    // A pretrained model knows its own token ids, not bytes: byte-tokenizing its text would
    // train it on ids 0-255 without a word of warning (issue 21, point 9).
    return Invalid("data.tokenizer",
                   "model.hf_directory with data.text_files needs the model's tokenizer: give "
                   "data.tokenizer (its SentencePiece .model), or \"bytes\" to train on bytes "
                   "on purpose, or tokenize first and give data.token_files");
  }
  if (data.tokenizer().empty() || data.tokenizer() == "bytes") {
    job.options.tokenizer = "bytes";
    if (job.model.vocab_size < 256) {
      return Invalid("model", absl::StrCat("vocab_size ", job.model.vocab_size,
                                           " is smaller than the byte tokenizer's 256"));
    }
    return absl::OkStatus();
  }
  // A SentencePiece model: only its path is checked here. It is never loaded inside megatraind
  // (libsentencepiece's bundled protobuf clashes with the daemon's); the job's first run
  // tokenizes the text with it in a megatrain_tokenize process (server/job_tokens.h), which also
  // checks its vocabulary against the model's.
  absl::StatusOr<std::string> tokenizer = paths.ResolveInput("data.tokenizer", data.tokenizer());
  if (!tokenizer.ok()) return tokenizer.status();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(*tokenizer, ec)) {
    return Invalid("data.tokenizer",
                   absl::StrCat("'", *tokenizer, "' is not a file (a SentencePiece .model)"));
  }
  job.options.tokenizer = *tokenizer;
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateData(const v1::DataSource& data, const PathPolicy& paths, ValidatedJob& job) {
  absl::Status source;
  if (IsSftData(data)) {
    source = ValidateSftData(data, paths, job);
  } else {
    source = RefuseSftOptions(data);
    if (source.ok()) {
      source = data.token_files_size() > 0 ? ValidateTokenFiles(data, paths, job)
                                           : ValidateTextFiles(data, paths, job);
    }
  }
  if (!source.ok()) return source;
  const double fraction =
      data.has_validation_fraction() ? data.validation_fraction() : kDefaultValidationFraction;
  if (absl::Status s = CheckFiniteRange("data.validation_fraction", fraction, 0, 0.5, false);
      !s.ok()) {
    return s;
  }
  job.options.validation_fraction = fraction;
  if (absl::Status s = CheckRange("data.eval_windows", data.eval_windows(), 0, 4096); !s.ok()) {
    return s;
  }
  job.options.eval_every = static_cast<int>(std::min<uint32_t>(data.eval_every_steps(), 1 << 30));
  return absl::OkStatus();
}

}  // namespace megatrain::service
