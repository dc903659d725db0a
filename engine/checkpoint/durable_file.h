// Durable file I/O for checkpoints: a checksumming append-only writer with an
// explicit fsync-and-close, directory fsync, and whole-file checksums.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/provenance/sha256.h"

namespace megatrain::engine {

// Size and CRC32C of a file's bytes.
struct FileChecksum {
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
  bool operator==(const FileChecksum&) const = default;
};

// Writes a new file front to back, keeping its size and CRC32C (and, when
// asked, its SHA-256: hashed while streaming, so a checkpoint's provenance
// record never re-reads what was just written). Move-only;
// the destructor closes without fsync (an abandoned file), Close() is the
// fallible commit.
class DurableFileWriter {
 public:
  // Creates `path`, which must not exist (O_EXCL), mode 0644.
  static absl::StatusOr<DurableFileWriter> Create(const std::string& path,
                                                  bool with_sha256 = false);

  DurableFileWriter(DurableFileWriter&& other) noexcept;
  DurableFileWriter& operator=(DurableFileWriter&& other) noexcept;
  DurableFileWriter(const DurableFileWriter&) = delete;
  DurableFileWriter& operator=(const DurableFileWriter&) = delete;
  ~DurableFileWriter();

  absl::Status Append(absl::Span<const uint8_t> data);
  absl::Status Append(std::string_view text);
  // fsync, then close; the checksum covers every appended byte.
  absl::Status Close();

  const std::string& path() const { return path_; }
  FileChecksum checksum() const { return checksum_; }
  // After Close, of a writer created with_sha256: the SHA-256 of every byte; else "".
  const std::string& sha256_hex() const { return sha256_hex_; }

 private:
  DurableFileWriter() = default;
  std::string path_;
  int fd_ = -1;
  FileChecksum checksum_;
  std::optional<provenance::Sha256> sha256_;
  std::string sha256_hex_;
};

// Writes `text` as a new file and returns its checksum (Create, Append, Close).
absl::StatusOr<FileChecksum> WriteDurableFile(const std::string& path, std::string_view text);

// Replaces (or creates) `path` with `text` durably: written to a temporary
// name beside it, fsynced, renamed over it, and the directory fsynced.
absl::Status ReplaceFileDurably(const std::string& path, std::string_view text);

// fsyncs a directory so the names created, renamed or removed in it persist.
absl::Status FsyncDirectory(const std::string& path);

// Reads the file in chunks (never whole into memory) and returns size and CRC32C.
// Only a regular file is read (a FIFO or device is refused, never waited on); with
// `follow_symlinks` false a symlink is refused too (a checkpoint's own files).
absl::StatusOr<FileChecksum> ChecksumFile(const std::string& path, bool follow_symlinks = true);
// The same for an open descriptor, read with pread from offset 0; errors name `path`.
absl::StatusOr<FileChecksum> ChecksumDescriptor(int fd, const std::string& path);

// "0x1234abcd".
std::string FormatCrc32c(uint32_t crc);

}  // namespace megatrain::engine
