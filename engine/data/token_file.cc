// Token files, read into memory (see token_file.h).
#include "engine/data/token_file.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/common/safe_files.h"

namespace megatrain::engine {

absl::StatusOr<TokenFileFormat> ParseTokenFileFormat(std::string_view name) {
  if (name == "u16") return TokenFileFormat::kUint16;
  if (name == "u32") return TokenFileFormat::kUint32;
  if (name == "llmc") return TokenFileFormat::kLlmc;
  return absl::InvalidArgumentError(
      absl::StrCat("token_format=\"", std::string(name), "\" is not u16, u32 or llmc"));
}

absl::StatusOr<TokenFile> TokenFile::Open(const std::string& path, TokenFileFormat format,
                                          const InputFiles* inputs) {
  // Read, not mapped: a file truncated by its owner while a job uses it would turn a mapped
  // access into SIGBUS and take the daemon down (issue 16, point 4). A regular file only: a FIFO
  // would block the caller (the request thread at submit, the runner at run).
  absl::StatusOr<std::string> bytes = ReadInputFile(inputs, path);
  if (!bytes.ok()) {
    if (bytes.status().code() == absl::StatusCode::kInvalidArgument) return bytes.status();
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", bytes.status().message()));
  }
  TokenFile f;
  f.path_ = path;
  f.bytes_ = *std::move(bytes);
  const uint8_t* data = reinterpret_cast<const uint8_t*>(f.bytes_.data());
  const size_t size = f.bytes_.size();
  size_t header = 0;
  if (format == TokenFileFormat::kLlmc) {
    header = kLlmcHeaderInts * sizeof(int32_t);
    if (size < header) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": ", size, " bytes, shorter than the llm.c header (", header, ")"));
    }
    int32_t h[3];
    std::memcpy(h, data, sizeof(h));
    if (h[0] != kLlmcMagic) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": llm.c magic ", h[0], " is not ", kLlmcMagic));
    }
    if (h[1] != 1 && h[1] != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": llm.c version ", h[1], " is not 1 (uint16 tokens) or 2 (uint32 tokens)"));
    }
    f.width_ = h[1] == 1 ? 2 : 4;
    if (h[2] < 0 || static_cast<uint64_t>(h[2]) * f.width_ != size - header) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": llm.c header says ", h[2],
                                                     " tokens but the file holds ",
                                                     size - header, " bytes of tokens"));
    }
  } else {
    f.width_ = format == TokenFileFormat::kUint16 ? 2 : 4;
    if (size % f.width_ != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": ", size, " bytes is not a whole number of ", f.width_, "-byte tokens"));
    }
  }
  f.header_ = header;
  f.count_ = (size - header) / f.width_;
  return f;
}

int32_t TokenFile::at(size_t index) const {
  const uint8_t* tokens_ = reinterpret_cast<const uint8_t*>(bytes_.data()) + header_;
  if (width_ == 2) {
    uint16_t t;
    std::memcpy(&t, tokens_ + index * 2, 2);  // little-endian host
    return t;
  }
  uint32_t t;
  std::memcpy(&t, tokens_ + index * 4, 4);
  // Ids above INT32_MAX cannot be valid for any vocabulary; clamped, they
  // still fail the vocabulary check (MaxToken) instead of turning negative.
  return t > static_cast<uint32_t>(INT32_MAX) ? INT32_MAX : static_cast<int32_t>(t);
}

absl::StatusOr<TokenFiles> TokenFiles::Open(const std::vector<std::string>& paths,
                                            TokenFileFormat format, const InputFiles* inputs) {
  if (paths.empty()) return absl::InvalidArgumentError("no token files given");
  TokenFiles out;
  for (const std::string& p : paths) {
    absl::StatusOr<TokenFile> f = TokenFile::Open(p, format, inputs);
    if (!f.ok()) return f.status();
    out.starts_.push_back(out.total_);
    out.total_ += f->size();
    out.files_.push_back(std::move(*f));
  }
  return out;
}

int32_t TokenFiles::at(size_t index) const {
  const size_t file = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), index) -
                                          starts_.begin()) -
                      1;
  return files_[file].at(index - starts_[file]);
}

int32_t TokenFiles::MaxToken() const {
  int32_t best = -1;
  for (const TokenFile& f : files_) {
    for (size_t i = 0; i < f.size(); ++i) best = std::max(best, f.at(i));
  }
  return best;
}

}  // namespace megatrain::engine
