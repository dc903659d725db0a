// SigningKey: an Ed25519 private key kept in a 0600 PEM file (OpenSSL), and
// signature verification against a raw public key.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

struct evp_pkey_st;

namespace megatrain::provenance {

inline constexpr size_t kEd25519PublicKeyBytes = 32;
inline constexpr size_t kEd25519SignatureBytes = 64;

class SigningKey {
 public:
  // Loads the key at `path`, or generates one and writes it there (mode 0600,
  // created exclusively, fsynced) when the file does not exist.
  static absl::StatusOr<SigningKey> LoadOrCreate(const std::string& path);
  // Loads an existing key (PKCS#8 PEM). Refused when the file is readable or
  // writable by group or others (the error names the mode), or not Ed25519.
  static absl::StatusOr<SigningKey> Load(const std::string& path);
  // A new key that lives only in memory (tests, ephemeral signers).
  static absl::StatusOr<SigningKey> Generate();

  SigningKey(SigningKey&& other) noexcept;
  SigningKey& operator=(SigningKey&& other) noexcept;
  SigningKey(const SigningKey&) = delete;
  SigningKey& operator=(const SigningKey&) = delete;
  ~SigningKey();

  // The 64-byte Ed25519 signature of `message`. Safe to call from several threads.
  std::string Sign(std::string_view message) const;
  std::string public_key_raw() const;  // 32 bytes
  std::string public_key_hex() const;  // 64 lower-case hex digits

  // Writes public_key_hex() and a newline to `path` (mode 0644, replaced if present).
  absl::Status WritePublicKeyFile(const std::string& path) const;

 private:
  explicit SigningKey(evp_pkey_st* key) : key_(key) {}
  evp_pkey_st* key_ = nullptr;
};

// The raw 32-byte public key from a file holding its hex (surrounding
// whitespace ignored); errors name the path.
absl::StatusOr<std::string> ReadPublicKeyFile(const std::string& path);

// True when `signature` is a valid Ed25519 signature of `message` under the
// raw 32-byte `public_key_raw`. False for malformed keys or signatures.
bool VerifySignature(std::string_view public_key_raw, std::string_view message,
                     std::string_view signature);

}  // namespace megatrain::provenance
