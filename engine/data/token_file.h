// Pre-tokenized token files, read on demand with pread (not mapped: a file truncated while
// mapped would kill the process with SIGBUS): raw little-endian
// uint16 or uint32 arrays (nanoGPT style), and llm.c's format (a header of
// 256 int32 — magic 20240520, version 1 = uint16 tokens / 2 = uint32 tokens,
// token count — then the tokens). Several files read as one stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/common/input_files.h"
#include "engine/common/unique_fd.h"

namespace megatrain::engine {

// A read-only sequence of token ids.
class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual size_t size() const = 0;
  // Tokens [start, start + count) into `out` (start + count <= size()). A file read on demand
  // that was cut short under the run is DATA_LOSS naming the file and the offset.
  virtual absl::Status Read(size_t start, size_t count, int32_t* out) const = 0;
};

// Every token of `source` (tests and tools; a training run reads windows).
absl::StatusOr<std::vector<int32_t>> ReadAllTokens(const TokenSource& source);

enum class TokenFileFormat { kUint16, kUint32, kLlmc };

// "u16", "u32" or "llmc"; InvalidArgument naming the value otherwise.
absl::StatusOr<TokenFileFormat> ParseTokenFileFormat(std::string_view name);

inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr size_t kLlmcHeaderInts = 256;

// One token file, read on demand with pread from its descriptor (the job's checked descriptor
// duplicated, or the path opened as a regular file): memory does not grow with the file, and a
// file truncated under the run fails the read that meets the cut (DATA_LOSS) instead of raising
// SIGBUS as a mapping would. Its size is fixed when it is opened. Move-only.
class TokenFile {
 public:
  // Refused with the path named: unreadable files, anything but a regular file (a FIFO is
  // refused without blocking), a size that is not a
  // whole number of tokens, a bad llm.c magic or version, or an llm.c token
  // count that disagrees with the file size.
  // With `inputs` (a daemon's run) the file is read from its checked descriptor.
  static absl::StatusOr<TokenFile> Open(const std::string& path, TokenFileFormat format,
                                        const InputFiles* inputs = nullptr);
  TokenFile(TokenFile&& other) noexcept = default;
  TokenFile& operator=(TokenFile&& other) noexcept = default;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const std::string& path() const { return path_; }
  size_t size() const { return count_; }
  // As TokenSource::Read, within this file.
  absl::Status Read(size_t start, size_t count, int32_t* out) const;

 private:
  TokenFile() = default;
  std::string path_;
  UniqueFd fd_;
  size_t header_ = 0;   // bytes before the first token (llm.c)
  size_t count_ = 0;
  int width_ = 2;  // bytes per token
};

// Files concatenated in the given order.
class TokenFiles : public TokenSource {
 public:
  static absl::StatusOr<TokenFiles> Open(const std::vector<std::string>& paths,
                                         TokenFileFormat format,
                                         const InputFiles* inputs = nullptr);
  size_t size() const override { return total_; }
  absl::Status Read(size_t start, size_t count, int32_t* out) const override;
  // The largest token id (reads every token once, in chunks); for checking against a vocabulary.
  absl::StatusOr<int32_t> MaxToken() const;

 private:
  std::vector<TokenFile> files_;
  std::vector<size_t> starts_;  // first global index of each file
  size_t total_ = 0;
};

// Tokens held in memory.
class VectorTokens : public TokenSource {
 public:
  explicit VectorTokens(std::vector<int32_t> tokens) : tokens_(std::move(tokens)) {}
  size_t size() const override { return tokens_.size(); }
  absl::Status Read(size_t start, size_t count, int32_t* out) const override;

 private:
  std::vector<int32_t> tokens_;
};

}  // namespace megatrain::engine
