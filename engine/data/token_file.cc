// Token files, read on demand (see token_file.h).
#include "engine/data/token_file.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/common/file_io.h"
#include "engine/data/checked_input_file.h"

namespace megatrain::engine {

absl::StatusOr<TokenFileFormat> ParseTokenFileFormat(std::string_view name) {
  if (name == "u16") return TokenFileFormat::kUint16;
  if (name == "u32") return TokenFileFormat::kUint32;
  if (name == "llmc") return TokenFileFormat::kLlmc;
  return absl::InvalidArgumentError(
      absl::StrCat("token_format=\"", std::string(name), "\" is not u16, u32 or llmc"));
}

namespace {

constexpr size_t kChunkTokens = size_t{1} << 20;

// Ids above INT32_MAX cannot be valid for any vocabulary; clamped, they still fail the
// vocabulary check (MaxToken) instead of turning negative.
int32_t Clamped(uint32_t t) {
  return t > static_cast<uint32_t>(INT32_MAX) ? INT32_MAX : static_cast<int32_t>(t);
}

}  // namespace

absl::StatusOr<TokenFile> TokenFile::Open(const std::string& path, TokenFileFormat format,
                                          const InputFiles* inputs) {
  // Read on demand, not mapped: a file truncated by its owner while a job uses it would turn a
  // mapped access into SIGBUS and take the daemon down (issue 16, point 4). A regular file only:
  // a FIFO would block the caller (the request thread at submit, the runner at run).
  absl::StatusOr<CheckedInputFile> file = OpenCheckedInputFile(path, inputs);
  if (!file.ok()) return file.status();
  TokenFile f;
  f.path_ = path;
  f.fd_ = std::move(file->fd);
  const size_t size = static_cast<size_t>(file->size);
  size_t header = 0;
  if (format == TokenFileFormat::kLlmc) {
    header = kLlmcHeaderInts * sizeof(int32_t);
    if (size < header) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": ", size, " bytes, shorter than the llm.c header (", header, ")"));
    }
    int32_t h[3];
    if (absl::Status s = PreadExactly(f.fd_.get(), 0, h, sizeof(h), path); !s.ok()) return s;
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

absl::Status TokenFile::Read(size_t start, size_t count, int32_t* out) const {
  if (start > count_ || count > count_ - start) {
    return absl::OutOfRangeError(absl::StrCat(path_, ": tokens [", start, ", ", start + count,
                                              ") outside its ", count_));
  }
  const uint64_t offset = header_ + static_cast<uint64_t>(start) * width_;
  // Read into the output's own bytes, then widened in place from the back (u16 -> int32).
  uint8_t* data = reinterpret_cast<uint8_t*>(out);
  if (absl::Status s = PreadExactly(fd_.get(), offset, data, count * width_, path_); !s.ok()) {
    return s;
  }
  if (width_ == 2) {
    for (size_t i = count; i-- > 0;) {
      uint16_t t;
      std::memcpy(&t, data + i * 2, 2);  // little-endian host
      out[i] = t;
    }
    return absl::OkStatus();
  }
  for (size_t i = 0; i < count; ++i) {
    uint32_t t;
    std::memcpy(&t, data + i * 4, 4);
    out[i] = Clamped(t);
  }
  return absl::OkStatus();
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

absl::Status TokenFiles::Read(size_t start, size_t count, int32_t* out) const {
  if (start > total_ || count > total_ - start) {
    return absl::OutOfRangeError(
        absl::StrCat("tokens [", start, ", ", start + count, ") outside ", total_));
  }
  size_t file = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), start) -
                                    starts_.begin()) -
                1;
  while (count > 0) {
    const size_t local = start - starts_[file];
    const size_t n = std::min(count, files_[file].size() - local);
    if (n > 0) {
      if (absl::Status s = files_[file].Read(local, n, out); !s.ok()) return s;
    }
    start += n;
    count -= n;
    out += n;
    ++file;
  }
  return absl::OkStatus();
}

absl::StatusOr<int32_t> TokenFiles::MaxToken() const {
  int32_t best = -1;
  std::vector<int32_t> chunk;
  for (size_t start = 0; start < total_; start += kChunkTokens) {
    const size_t n = std::min(kChunkTokens, total_ - start);
    chunk.resize(n);
    if (absl::Status s = Read(start, n, chunk.data()); !s.ok()) return s;
    best = std::max(best, *std::max_element(chunk.begin(), chunk.end()));
  }
  return best;
}

absl::Status VectorTokens::Read(size_t start, size_t count, int32_t* out) const {
  if (start > tokens_.size() || count > tokens_.size() - start) {
    return absl::OutOfRangeError(
        absl::StrCat("tokens [", start, ", ", start + count, ") outside ", tokens_.size()));
  }
  std::copy_n(tokens_.begin() + static_cast<std::ptrdiff_t>(start), count, out);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> ReadAllTokens(const TokenSource& source) {
  std::vector<int32_t> all(source.size());
  if (absl::Status s = source.Read(0, all.size(), all.data()); !s.ok()) return s;
  return all;
}

}  // namespace megatrain::engine
