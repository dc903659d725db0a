// Ed25519 signing keys over OpenSSL EVP_PKEY.
#include "engine/provenance/signing_key.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/file_io.h"
#include "engine/common/hex.h"
#include "engine/common/unique_fd.h"
#include "engine/provenance/sha256.h"

namespace megatrain::provenance {
namespace {

constexpr size_t kMaxKeyFileBytes = 16 << 10;

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct MdCtxFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;
using MdCtxPtr = std::unique_ptr<EVP_MD_CTX, MdCtxFree>;

std::string OpensslError() {
  const unsigned long code = ERR_get_error();
  if (code == 0) return "unknown OpenSSL error";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  ERR_clear_error();
  return text;
}

// "<path>: <what>: <strerror>" with the code of engine::ErrnoStatus, for the errno just set.
absl::Status ErrnoError(const std::string& path, const char* what) {
  return engine::ErrnoStatus(errno, absl::StrCat(path, ": ", what));
}

// A key file's text; a file larger than any key is refused.
absl::StatusOr<std::string> ReadKeyFile(int fd, const std::string& path) {
  absl::StatusOr<std::string> text = engine::ReadAll(fd, path, kMaxKeyFileBytes);
  if (absl::IsResourceExhausted(text.status())) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": larger than ", kMaxKeyFileBytes, " bytes; not a key file"));
  }
  return text;
}

}  // namespace

absl::StatusOr<SigningKey> SigningKey::Generate() {
  EVP_PKEY* key = EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519");
  if (key == nullptr) {
    return absl::InternalError(absl::StrCat("Ed25519 key generation failed: ", OpensslError()));
  }
  return SigningKey(key);
}

absl::StatusOr<SigningKey> SigningKey::Load(const std::string& path) {
  const engine::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return ErrnoError(path, "cannot open signing key");
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoError(path, "stat failed");
  if (!S_ISREG(st.st_mode) || (st.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "%s: signing key file has mode %04o; it must be a regular file readable only by its "
        "owner (chmod 600 %s)",
        path, st.st_mode & 07777, path));
  }
  absl::StatusOr<std::string> pem = ReadKeyFile(fd.get(), path);
  if (!pem.ok()) return pem.status();
  BioPtr bio(BIO_new_mem_buf(pem->data(), static_cast<int>(pem->size())));
  if (bio == nullptr) return absl::InternalError("BIO_new_mem_buf failed");
  PkeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a PEM private key: ", OpensslError()));
  }
  if (EVP_PKEY_get_id(key.get()) != EVP_PKEY_ED25519) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": the private key is not Ed25519"));
  }
  return SigningKey(key.release());
}

absl::StatusOr<SigningKey> SigningKey::LoadOrCreate(const std::string& path) {
  engine::UniqueFd fd(
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) {
    if (errno == EEXIST) return Load(path);
    return ErrnoError(path, "cannot create signing key");
  }
  auto fail = [&](absl::Status status) {
    fd.Reset();
    ::unlink(path.c_str());
    return status;
  };
  absl::StatusOr<SigningKey> key = Generate();
  if (!key.ok()) return fail(key.status());
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (bio == nullptr ||
      PEM_write_bio_PrivateKey(bio.get(), key->key_, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return fail(absl::InternalError(absl::StrCat("PEM encoding failed: ", OpensslError())));
  }
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  // The umask may only have narrowed the mode; fchmod makes it exactly 0600.
  if (::fchmod(fd.get(), 0600) != 0) return fail(ErrnoError(path, "fchmod failed"));
  if (absl::Status s =
          engine::WriteAll(fd.get(), std::string_view(data, static_cast<size_t>(size)), path);
      !s.ok()) {
    return fail(s);
  }
  if (::fsync(fd.get()) != 0) return fail(ErrnoError(path, "fsync failed"));
  if (::close(fd.Release()) != 0) return ErrnoError(path, "close failed");
  return key;
}

SigningKey::SigningKey(SigningKey&& other) noexcept : key_(other.key_) { other.key_ = nullptr; }

SigningKey& SigningKey::operator=(SigningKey&& other) noexcept {
  if (this != &other) {
    EVP_PKEY_free(key_);
    key_ = other.key_;
    other.key_ = nullptr;
  }
  return *this;
}

SigningKey::~SigningKey() { EVP_PKEY_free(key_); }

std::string SigningKey::Sign(std::string_view message) const {
  MdCtxPtr ctx(EVP_MD_CTX_new());
  std::string signature(kEd25519SignatureBytes, '\0');
  size_t length = signature.size();
  if (ctx == nullptr || key_ == nullptr ||
      EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, key_) != 1 ||
      EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(signature.data()), &length,
                     reinterpret_cast<const unsigned char*>(message.data()), message.size()) != 1 ||
      length != kEd25519SignatureBytes) {
    // Signing with a loaded Ed25519 key fails only on allocation failure.
    std::fprintf(stderr, "SigningKey::Sign: %s\n", OpensslError().c_str());
    std::abort();
  }
  return signature;
}

std::string SigningKey::public_key_raw() const {
  std::string raw(kEd25519PublicKeyBytes, '\0');
  size_t length = raw.size();
  if (key_ == nullptr ||
      EVP_PKEY_get_raw_public_key(key_, reinterpret_cast<unsigned char*>(raw.data()), &length) !=
          1 ||
      length != kEd25519PublicKeyBytes) {
    std::fprintf(stderr, "SigningKey::public_key_raw: %s\n", OpensslError().c_str());
    std::abort();
  }
  return raw;
}

std::string SigningKey::public_key_hex() const { return engine::HexEncode(public_key_raw()); }

absl::Status SigningKey::WritePublicKeyFile(const std::string& path) const {
  engine::UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) return ErrnoError(path, "cannot create");
  absl::Status s = engine::WriteAll(fd.get(), public_key_hex() + "\n", path);
  if (s.ok() && ::fsync(fd.get()) != 0) s = ErrnoError(path, "fsync failed");
  if (::close(fd.Release()) != 0 && s.ok()) s = ErrnoError(path, "close failed");
  return s;
}

absl::StatusOr<std::string> ReadPublicKeyFile(const std::string& path) {
  const engine::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoError(path, "cannot open public key");
  absl::StatusOr<std::string> text = ReadKeyFile(fd.get(), path);
  if (!text.ok()) return text.status();
  const std::string hex(absl::StripAsciiWhitespace(*text));
  absl::StatusOr<std::string> raw = engine::HexDecode(hex);
  if (!raw.ok() || raw->size() != kEd25519PublicKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": expected the ", 2 * kEd25519PublicKeyBytes,
                     " hex digits of an Ed25519 public key, found ", hex.size(), " characters",
                     raw.ok() ? "" : absl::StrCat(" (", std::string(raw.status().message()), ")")));
  }
  return raw;
}

bool VerifySignature(std::string_view public_key_raw, std::string_view message,
                     std::string_view signature) {
  if (public_key_raw.size() != kEd25519PublicKeyBytes ||
      signature.size() != kEd25519SignatureBytes) {
    return false;
  }
  PkeyPtr key(EVP_PKEY_new_raw_public_key(
      EVP_PKEY_ED25519, nullptr, reinterpret_cast<const unsigned char*>(public_key_raw.data()),
      public_key_raw.size()));
  MdCtxPtr ctx(EVP_MD_CTX_new());
  if (key == nullptr || ctx == nullptr ||
      EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, key.get()) != 1) {
    ERR_clear_error();
    return false;
  }
  const bool ok =
      EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()),
                       signature.size(), reinterpret_cast<const unsigned char*>(message.data()),
                       message.size()) == 1;
  ERR_clear_error();
  return ok;
}

}  // namespace megatrain::provenance
