// SigningKey: sign/verify round trip, key files created 0600, loose modes refused.
#include "engine/provenance/signing_key.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace megatrain::provenance {
namespace {

std::string TempPath(const std::string& name) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  std::filesystem::remove(path);
  return path;
}

TEST(SigningKeyTest, SignatureVerifiesOnlyForItsMessageAndKey) {
  absl::StatusOr<SigningKey> key = SigningKey::Generate();
  ASSERT_TRUE(key.ok()) << key.status();
  const std::string message = "provenance bytes\n";
  const std::string signature = key->Sign(message);
  ASSERT_EQ(signature.size(), kEd25519SignatureBytes);
  ASSERT_EQ(key->public_key_raw().size(), kEd25519PublicKeyBytes);
  EXPECT_TRUE(VerifySignature(key->public_key_raw(), message, signature));
  EXPECT_FALSE(VerifySignature(key->public_key_raw(), "provenance bytes!", signature));
  std::string flipped = signature;
  flipped[17] ^= 1;
  EXPECT_FALSE(VerifySignature(key->public_key_raw(), message, flipped));
  absl::StatusOr<SigningKey> other = SigningKey::Generate();
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(VerifySignature(other->public_key_raw(), message, signature));
  EXPECT_FALSE(VerifySignature("short", message, signature));
}

TEST(SigningKeyTest, LoadOrCreateWritesMode0600AndReloadsTheSameKey) {
  const std::string path = TempPath("daemon.key");
  const mode_t old_umask = ::umask(0);  // the file must still be 0600
  absl::StatusOr<SigningKey> created = SigningKey::LoadOrCreate(path);
  ::umask(old_umask);
  ASSERT_TRUE(created.ok()) << created.status();
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  absl::StatusOr<SigningKey> loaded = SigningKey::LoadOrCreate(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->public_key_hex(), created->public_key_hex());
  EXPECT_EQ(loaded->public_key_hex().size(), 2 * kEd25519PublicKeyBytes);
  const std::string signature = loaded->Sign("m");
  EXPECT_TRUE(VerifySignature(created->public_key_raw(), "m", signature));
}

TEST(SigningKeyTest, GroupOrWorldReadableKeyIsRefusedNamingTheMode) {
  const std::string path = TempPath("loose.key");
  ASSERT_TRUE(SigningKey::LoadOrCreate(path).ok());
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  absl::StatusOr<SigningKey> loaded = SigningKey::Load(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(loaded.status().message().find("0644"), std::string::npos) << loaded.status();
  ASSERT_EQ(::chmod(path.c_str(), 0640), 0);
  EXPECT_FALSE(SigningKey::LoadOrCreate(path).ok());
}

TEST(SigningKeyTest, PublicKeyFileRoundTripAndBadFiles) {
  absl::StatusOr<SigningKey> key = SigningKey::Generate();
  ASSERT_TRUE(key.ok());
  const std::string path = TempPath("key.pub");
  ASSERT_TRUE(key->WritePublicKeyFile(path).ok());
  absl::StatusOr<std::string> raw = ReadPublicKeyFile(path);
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_EQ(*raw, key->public_key_raw());
  EXPECT_FALSE(ReadPublicKeyFile(path + ".missing").ok());
  const std::string bad = TempPath("bad.pub");
  ASSERT_TRUE(SigningKey::Generate()->WritePublicKeyFile(bad).ok());
  std::filesystem::resize_file(bad, 20);
  absl::StatusOr<std::string> truncated = ReadPublicKeyFile(bad);
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.status().message().find("bad.pub"), std::string::npos);
}

TEST(SigningKeyTest, NonKeyFileIsRefused) {
  const std::string path = TempPath("garbage.key");
  {
    FILE* f = std::fopen(path.c_str(), "w");
    std::fputs("not a key\n", f);
    std::fclose(f);
  }
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  absl::StatusOr<SigningKey> loaded = SigningKey::Load(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("garbage.key"), std::string::npos);
}

}  // namespace
}  // namespace megatrain::provenance
