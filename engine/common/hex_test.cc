// Hex encoding round trip and the decoder's refusals.
#include "engine/common/hex.h"

#include <gtest/gtest.h>

#include <string>

namespace megatrain::engine {
namespace {

TEST(HexTest, RoundTripAndErrors) {
  EXPECT_EQ(HexEncode(std::string("\x00\x7f\xff", 3)), "007fff");
  EXPECT_EQ(*HexDecode("007FfF"), std::string("\x00\x7f\xff", 3));
  EXPECT_FALSE(HexDecode("abc").ok());
  EXPECT_FALSE(HexDecode("zz").ok());
}

}  // namespace
}  // namespace megatrain::engine
