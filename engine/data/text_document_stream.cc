// A corpus's documents, one at a time (see text_document_stream.h).
#include "engine/data/text_document_stream.h"

#include <unistd.h>

#include <cerrno>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/common/file_io.h"
#include "engine/common/safe_files.h"
#include "engine/data/corpus_files.h"
#include "engine/data/jsonl_corpus.h"

namespace megatrain::engine {
namespace {

constexpr size_t kReadBytes = size_t{1} << 20;

// A read failure keeps INVALID_ARGUMENT (a FIFO, a directory); anything else is reported as
// PERMISSION_DENIED, as the whole-file readers do.
absl::Status ReadFailure(const absl::Status& s, absl::string_view kind) {
  return absl::Status(s.code() == absl::StatusCode::kInvalidArgument
                          ? absl::StatusCode::kInvalidArgument
                          : absl::StatusCode::kPermissionDenied,
                      absl::StrCat("cannot read ", kind, " file: ", s.message()));
}

// Fortune entries (text between lines that are a single '%'), trailing newlines removed and
// empty entries dropped: SplitFortunes, fed one line at a time.
class FortuneSplitter {
 public:
  explicit FortuneSplitter(const std::function<absl::Status(std::string_view)>& each)
      : each_(each) {}
  absl::Status Line(const std::string& line) {
    if (line == "%") return Flush();
    current_ += line;
    current_ += '\n';
    return absl::OkStatus();
  }
  absl::Status Flush() {
    while (!current_.empty() && current_.back() == '\n') current_.pop_back();
    absl::Status s = absl::OkStatus();
    if (!current_.empty()) {
      ++documents_;
      s = each_(current_);
    }
    current_.clear();
    return s;
  }
  uint64_t documents() const { return documents_; }

 private:
  const std::function<absl::Status(std::string_view)>& each_;
  std::string current_;
  uint64_t documents_ = 0;
};

}  // namespace

absl::StatusOr<bool> FileLineReader::Next(std::string* line) {
  line->clear();
  while (true) {
    const size_t newline = buffer_.find('\n', buffer_pos_);
    if (newline != std::string::npos) {
      line->append(buffer_, buffer_pos_, newline - buffer_pos_);
      buffer_pos_ = newline + 1;
      return true;
    }
    line->append(buffer_, buffer_pos_, std::string::npos);
    buffer_.clear();
    buffer_pos_ = 0;
    if (eof_) return !line->empty();
    buffer_.resize(kReadBytes);
    ssize_t n;
    do {
      n = ::pread(fd_, buffer_.data(), buffer_.size(), static_cast<off_t>(file_offset_));
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
      const int err = errno;
      buffer_.clear();
      return ErrnoStatus(err, absl::StrCat("cannot read '", path_, "' at offset ", file_offset_));
    }
    buffer_.resize(static_cast<size_t>(n));
    file_offset_ += static_cast<uint64_t>(n);
    if (n == 0) eof_ = true;
  }
}

absl::StatusOr<uint64_t> ForEachTextDocument(
    const std::vector<std::string>& paths, const TextDocumentOptions& options,
    const std::function<absl::Status(std::string_view document)>& each) {
  absl::StatusOr<std::vector<std::string>> expanded = ExpandCorpusFiles(paths);
  if (!expanded.ok()) return expanded.status();
  uint64_t documents = 0;
  std::string line;
  for (const std::string& f : *expanded) {
    const bool jsonl = options.jsonl_by_extension && absl::EndsWith(f, ".jsonl");
    const absl::string_view kind = jsonl ? "JSONL" : "text";
    UniqueFd opened;
    int fd = -1;
    if (options.inputs != nullptr) {
      absl::StatusOr<int> held = options.inputs->Descriptor(f);
      if (!held.ok()) return ReadFailure(held.status(), kind);
      fd = *held;
    } else {
      // A regular file only: a FIFO or device would block or never end (issue 16, point 3).
      absl::StatusOr<UniqueFd> file = OpenRegularFileForRead(f);
      if (!file.ok()) return ReadFailure(file.status(), kind);
      opened = *std::move(file);
      fd = opened.get();
    }
    FileLineReader reader(fd, f);
    FortuneSplitter fortunes(each);
    uint64_t line_number = 0;
    while (true) {
      absl::StatusOr<bool> more = reader.Next(&line);
      if (!more.ok()) return ReadFailure(more.status(), kind);
      if (!*more) break;
      if (!jsonl) {
        if (absl::Status s = fortunes.Line(line); !s.ok()) return s;
        continue;
      }
      absl::StatusOr<std::optional<std::string>> doc =
          JsonlLineDocument(line, absl::StrCat(f, ":", ++line_number));
      if (!doc.ok()) return doc.status();
      if (!doc->has_value()) continue;
      ++documents;
      if (absl::Status s = each(**doc); !s.ok()) return s;
    }
    if (absl::Status s = fortunes.Flush(); !s.ok()) return s;
    documents += fortunes.documents();
  }
  if (documents == 0) return absl::InvalidArgumentError("text files contain no documents");
  return documents;
}

}  // namespace megatrain::engine
