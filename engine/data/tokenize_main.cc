// megatrain_tokenize: turns text/JSONL corpora into one raw token file with
// the byte tokenizer or a SentencePiece model, exactly as training on the
// text would tokenize it (documents in order, each followed by the
// end-of-document id), streaming: memory holds one document, not the corpus. A separate process so the daemon never loads
// SentencePiece, whose bundled protobuf clashes with the system one.
// Prints one JSON line {tokens, documents, vocab_size, end_of_document,
// format, out, output_version}. Exit: 0 written, 1 failed (reason on stderr), 2 usage.
// megatraind passes the inputs it checked as inherited descriptors (--input_fds,
// --tokenizer_fd), so the tool reads those and never opens the paths again.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/common/input_files.h"
#include "engine/common/safe_files.h"
#include "engine/data/text_document_stream.h"
#include "engine/data/text_tokenizer.h"
#include "engine/data/tokenize_version.h"

ABSL_FLAG(std::string, tokenizer, "bytes", "\"bytes\" or the path of a SentencePiece .model.");
ABSL_FLAG(std::string, out, "",
          "Output token file (written under a temporary name in its directory, then renamed).");
ABSL_FLAG(std::string, format, "auto",
          "u16, u32 or auto (u16 when the vocabulary fits in 16 bits).");
ABSL_FLAG(std::string, input_fds, "",
          "Comma-separated inherited descriptors, one per input in order: each input is read "
          "from its descriptor and its name only chooses the format (megatraind passes the "
          "files it checked when the job started).");
ABSL_FLAG(int, tokenizer_fd, -1,
          "An inherited descriptor of the SentencePiece model named by --tokenizer.");

namespace megatrain::engine {
namespace {

// Tokens appended to a FileInDirectoryWriter as u16 or u32, one document at a time.
class TokenSink {
 public:
  TokenSink(FileInDirectoryWriter writer, bool u16) : writer_(std::move(writer)), u16_(u16) {}
  absl::Status Append(const std::vector<int32_t>& tokens) {
    count_ += tokens.size();
    if (!u16_) {
      return writer_.Append(std::string_view(reinterpret_cast<const char*>(tokens.data()),
                                             tokens.size() * sizeof(int32_t)));
    }
    narrow_.assign(tokens.begin(), tokens.end());
    return writer_.Append(std::string_view(reinterpret_cast<const char*>(narrow_.data()),
                                           narrow_.size() * sizeof(uint16_t)));
  }
  absl::Status Commit() { return writer_.Commit(); }
  uint64_t count() const { return count_; }

 private:
  FileInDirectoryWriter writer_;
  bool u16_;
  std::vector<uint16_t> narrow_;
  uint64_t count_ = 0;
};

// Streams the corpus into `out`: documents one at a time, each encoded and followed by the
// end-of-document id, so memory holds one document and its tokens, never the corpus. The file
// is written under a fresh random name with O_EXCL|O_NOFOLLOW and renamed over `out` at the
// end, so a symlink planted in the (possibly group-writable) output directory is never
// followed and a failed run leaves no partial file.
absl::StatusOr<uint64_t> StreamTokens(const std::vector<std::string>& inputs,
                                      const InputFiles* read_from, const TextTokenizer& tokenizer,
                                      bool u16, const std::string& out, uint64_t* token_count) {
  const size_t slash = out.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : out.substr(0, slash);
  const std::string name = slash == std::string::npos ? out : out.substr(slash + 1);
  absl::StatusOr<FileInDirectoryWriter> writer = FileInDirectoryWriter::Create(dir, name);
  if (!writer.ok()) {
    return absl::DataLossError(absl::StrCat("cannot write ", out, ": ", writer.status().message()));
  }
  TokenSink sink(*std::move(writer), u16);
  std::vector<int32_t> tokens;
  absl::StatusOr<uint64_t> documents = ForEachTextDocument(
      inputs, TextDocumentOptions{/*jsonl_by_extension=*/true, read_from},
      [&](std::string_view document) {
        tokens.clear();
        if (absl::Status s = tokenizer.Encode(document, &tokens); !s.ok()) return s;
        tokens.push_back(tokenizer.end_of_document());
        absl::Status s = sink.Append(tokens);
        if (!s.ok()) return absl::DataLossError(absl::StrCat("cannot write ", out, ": ", s.message()));
        return absl::OkStatus();
      });
  if (!documents.ok()) return documents.status();
  if (absl::Status s = sink.Commit(); !s.ok()) {
    return absl::DataLossError(absl::StrCat("cannot write ", out, ": ", s.message()));
  }
  *token_count = sink.count();
  return documents;
}

int Run(const std::vector<std::string>& inputs) {
  const std::string out = absl::GetFlag(FLAGS_out);
  const std::string format = absl::GetFlag(FLAGS_format);
  if (out.empty() || inputs.empty() || (format != "auto" && format != "u16" && format != "u32")) {
    std::fprintf(stderr, "%s\n", std::string(absl::ProgramUsageMessage()).c_str());
    return 2;
  }
  InputFiles held;
  const bool from_fds = !absl::GetFlag(FLAGS_input_fds).empty();
  if (from_fds) {
    const std::vector<std::string> fds = absl::StrSplit(absl::GetFlag(FLAGS_input_fds), ',');
    int fd = -1;
    if (fds.size() != inputs.size()) {
      std::fprintf(stderr, "megatrain_tokenize: --input_fds names %zu descriptors for %zu inputs\n",
                   fds.size(), inputs.size());
      return 2;
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!absl::SimpleAtoi(fds[i], &fd) || fd < 3) {
        std::fprintf(stderr, "megatrain_tokenize: --input_fds: '%s' is not a descriptor\n",
                     fds[i].c_str());
        return 2;
      }
      held.Add(inputs[i], UniqueFd(fd));
    }
    if (absl::GetFlag(FLAGS_tokenizer_fd) >= 3) {
      held.Add(absl::GetFlag(FLAGS_tokenizer), UniqueFd(absl::GetFlag(FLAGS_tokenizer_fd)));
    }
  }
  const InputFiles* read_from = from_fds ? &held : nullptr;
  absl::StatusOr<std::unique_ptr<TextTokenizer>> tokenizer =
      CreateTextTokenizer(absl::GetFlag(FLAGS_tokenizer), read_from);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "megatrain_tokenize: %s\n",
                 std::string(tokenizer.status().message()).c_str());
    return 1;
  }
  const int vocab = (*tokenizer)->vocab_size();
  const bool u16 = format == "u16" || (format == "auto" && vocab <= 65536);
  if (u16 && vocab > 65536) {
    std::fprintf(stderr, "megatrain_tokenize: --format=u16 cannot hold vocab_size=%d\n", vocab);
    return 1;
  }
  uint64_t token_count = 0;
  absl::StatusOr<uint64_t> documents =
      StreamTokens(inputs, read_from, **tokenizer, u16, out, &token_count);
  if (!documents.ok()) {
    std::fprintf(stderr, "megatrain_tokenize: %s\n",
                 std::string(documents.status().message()).c_str());
    return 1;
  }
  nlohmann::ordered_json report;  // a JSON writer: `out` may hold quotes or backslashes
  report["tokens"] = token_count;
  report["documents"] = *documents;
  report["vocab_size"] = vocab;
  report["end_of_document"] = (*tokenizer)->end_of_document();
  report["format"] = u16 ? "u16" : "u32";
  report["out"] = out;
  report["output_version"] = kTokenizeOutputVersion;
  std::printf(
      "%s\n",
      report.dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::ordered_json::error_handler_t::replace)
          .c_str());
  return 0;
}

}  // namespace
}  // namespace megatrain::engine

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "megatrain_tokenize --tokenizer=bytes|MODEL.model --out=FILE [--format=auto|u16|u32] "
      "TEXT_OR_JSONL...");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  return megatrain::engine::Run(std::vector<std::string>(rest.begin() + 1, rest.end()));
}
