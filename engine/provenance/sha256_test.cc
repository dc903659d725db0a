// Sha256: NIST FIPS 180-2 example vectors, incremental updates, file hashing.
#include "engine/provenance/sha256.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace megatrain::provenance {
namespace {

TEST(Sha256Test, NistVectors) {
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  Sha256 million;
  const std::string chunk(1000, 'a');
  for (int i = 0; i < 1000; ++i) million.Update(chunk);
  EXPECT_EQ(million.FinalHex(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Test, IncrementalEqualsOneShotAndFinalResets) {
  std::string text;
  for (int i = 0; i < 1237; ++i) text.push_back(static_cast<char>(i * 31 + 7));
  Sha256 sha;
  for (size_t at = 0, piece = 1; at < text.size(); at += piece, piece = piece * 3 % 97 + 1) {
    sha.Update(std::string_view(text).substr(at, piece));
  }
  EXPECT_EQ(sha.FinalHex(), Sha256Hex(text));
  sha.Update("abc");  // Final reset the hasher
  EXPECT_EQ(sha.FinalHex(), Sha256Hex("abc"));
  Sha256 moved = std::move(sha);
  moved.Update("abc");
  EXPECT_EQ(moved.FinalHex(), Sha256Hex("abc"));
}

TEST(Sha256Test, FileIsStreamedAndErrorsNameThePath) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/sha_file";
  std::string text(3 * (1 << 20) + 11, 'x');
  for (size_t i = 0; i < text.size(); i += 4093) text[i] = static_cast<char>(i);
  std::ofstream(path, std::ios::binary) << text;
  absl::StatusOr<std::string> hex = Sha256FileHex(path);
  ASSERT_TRUE(hex.ok()) << hex.status();
  EXPECT_EQ(*hex, Sha256Hex(text));
  absl::StatusOr<std::string> missing = Sha256FileHex(path + ".missing");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("sha_file.missing"), std::string::npos);
}

}  // namespace
}  // namespace megatrain::provenance
