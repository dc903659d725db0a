// CRC32C against published check values, across split points, and hardware vs table.
#include "engine/common/crc32c.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace megatrain::engine {
namespace {

absl::Span<const uint8_t> Bytes(const std::string& s) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

TEST(Crc32cTest, KnownValues) {
  // RFC 3720 B.4 and the standard "123456789" check value.
  EXPECT_EQ(Crc32c(Bytes("123456789")), 0xE3069283u);
  EXPECT_EQ(Crc32c(Bytes("")), 0u);
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xFF), ascending(32);
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(Crc32c(zeros), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(ones), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(Crc32cExtendPortable(0, zeros), 0x8A9136AAu);
  EXPECT_EQ(Crc32cExtendPortable(0, ascending), 0x46DD794Eu);
}

TEST(Crc32cTest, StreamingEqualsOneShotAndPortableEqualsFast) {
  std::vector<uint8_t> data(1031);  // odd length: every tail size is exercised below
  uint32_t state = 12345;
  for (uint8_t& b : data) {
    state = state * 1103515245u + 12345u;
    b = static_cast<uint8_t>(state >> 16);
  }
  const uint32_t whole = Crc32c(data);
  EXPECT_EQ(Crc32cExtendPortable(0, data), whole);
  for (size_t split : {0, 1, 7, 8, 9, 500, 1030, 1031}) {
    const auto a = absl::MakeConstSpan(data).subspan(0, split);
    const auto b = absl::MakeConstSpan(data).subspan(split);
    EXPECT_EQ(Crc32cExtend(Crc32cExtend(0, a), b), whole) << split;
    EXPECT_EQ(Crc32cExtendPortable(Crc32cExtendPortable(0, a), b), whole) << split;
  }
  for (size_t offset = 0; offset < 9; ++offset) {  // unaligned starts
    const auto s = absl::MakeConstSpan(data).subspan(offset, 100);
    EXPECT_EQ(Crc32c(s), Crc32cExtendPortable(0, s)) << offset;
  }
}

}  // namespace
}  // namespace megatrain::engine
