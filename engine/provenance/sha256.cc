// SHA-256 via OpenSSL EVP.
#include "engine/provenance/sha256.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/common/file_io.h"
#include "engine/common/hex.h"
#include "engine/common/safe_files.h"

namespace megatrain::provenance {
namespace {

// OpenSSL fails these calls only on allocation failure or misuse: programmer errors.
void Require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "Sha256: %s\n", what);
  std::abort();
}

void Init(EVP_MD_CTX* ctx) {
  Require(EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) == 1, "EVP_DigestInit_ex failed");
}

}  // namespace

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  Require(ctx_ != nullptr, "EVP_MD_CTX_new failed");
  Init(ctx_);
}

Sha256::Sha256(Sha256&& other) noexcept : ctx_(other.ctx_) { other.ctx_ = nullptr; }

Sha256& Sha256::operator=(Sha256&& other) noexcept {
  if (this != &other) {
    EVP_MD_CTX_free(ctx_);
    ctx_ = other.ctx_;
    other.ctx_ = nullptr;
  }
  return *this;
}

Sha256::~Sha256() { EVP_MD_CTX_free(ctx_); }

void Sha256::Update(absl::Span<const uint8_t> bytes) {
  Require(ctx_ != nullptr, "used after move");
  if (bytes.empty()) return;
  Require(EVP_DigestUpdate(ctx_, bytes.data(), bytes.size()) == 1, "EVP_DigestUpdate failed");
}

void Sha256::Update(std::string_view bytes) {
  Update(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

Sha256Digest Sha256::Final() {
  Require(ctx_ != nullptr, "used after move");
  Sha256Digest digest;
  unsigned int length = 0;
  Require(EVP_DigestFinal_ex(ctx_, digest.data(), &length) == 1 && length == digest.size(),
          "EVP_DigestFinal_ex failed");
  Init(ctx_);
  return digest;
}

std::string Sha256::FinalHex() {
  const Sha256Digest digest = Final();
  return engine::HexEncode(absl::MakeConstSpan(digest));
}

std::string Sha256Hex(std::string_view bytes) {
  Sha256 sha;
  sha.Update(bytes);
  return sha.FinalHex();
}

absl::StatusOr<std::string> Sha256FileHex(const std::string& path) {
  // A regular-file check on a descriptor opened with O_NONBLOCK: a FIFO swapped in for a data
  // file must not block the daemon's runner or request thread (issue 16, point 3).
  absl::StatusOr<engine::UniqueFd> fd = engine::OpenRegularFileForRead(path);
  if (!fd.ok()) return fd.status();
  return Sha256DescriptorHex(fd->get(), path);
}

absl::StatusOr<std::string> Sha256DescriptorHex(int fd, const std::string& path) {
  Sha256 sha;
  std::vector<uint8_t> chunk(size_t{1} << 20);
  uint64_t offset = 0;
  while (true) {
    const ssize_t n = ::pread(fd, chunk.data(), chunk.size(), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return engine::ErrnoStatus(errno, absl::StrCat(path, ": read failed"));
    }
    if (n == 0) break;
    offset += static_cast<uint64_t>(n);
    sha.Update(absl::MakeConstSpan(chunk.data(), static_cast<size_t>(n)));
  }
  return sha.FinalHex();
}

}  // namespace megatrain::provenance
