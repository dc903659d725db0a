// SHA-256 over OpenSSL's EVP interface: an incremental hasher and a streaming file hash.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

struct evp_md_ctx_st;

namespace megatrain::provenance {

using Sha256Digest = std::array<uint8_t, 32>;

// Move-only. Update any number of times, then Final once; Final resets the
// hasher so it can be reused for new input.
class Sha256 {
 public:
  Sha256();
  Sha256(Sha256&& other) noexcept;
  Sha256& operator=(Sha256&& other) noexcept;
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  ~Sha256();

  void Update(absl::Span<const uint8_t> bytes);
  void Update(std::string_view bytes);
  Sha256Digest Final();
  std::string FinalHex();

 private:
  evp_md_ctx_st* ctx_ = nullptr;
};

std::string Sha256Hex(std::string_view bytes);

// Streams the file in chunks; errors name the path.
absl::StatusOr<std::string> Sha256FileHex(const std::string& path);
// The same for an open descriptor, read with pread from offset 0; errors name `path`.
absl::StatusOr<std::string> Sha256DescriptorHex(int fd, const std::string& path);

}  // namespace megatrain::provenance
