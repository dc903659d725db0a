// The bf16 storage policy the .cu kernels use (bf16_storage.h: cuda_bf16.h's
// __float2bfloat16_rn / __bfloat162float, compiled here for the host) agrees
// bitwise with kernels/common/bf16.h, the twin the CPU kernels and the block
// emulator tests use: every bf16 pattern widens the same, and fp32 values
// (ties, overflow, subnormals, NaN, a sweep of bit patterns) round the same.
#include "kernels/cuda/bf16_storage.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/common/bf16.h"

namespace megatrain::kernels::cuda {
namespace {

uint16_t BitsOf(__nv_bfloat16 v) {
  uint16_t b = 0;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

__nv_bfloat16 FromBits(uint16_t b) {
  __nv_bfloat16_raw raw;
  raw.x = b;
  return __nv_bfloat16(raw);
}

float FloatOf(uint32_t bits) {
  float f = 0.0f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

TEST(Bf16StorageTest, WideningMatchesForEveryPattern) {
  for (uint32_t b = 0; b <= 0xffffu; ++b) {
    const float device = Bf16Storage::Load(FromBits(static_cast<uint16_t>(b)));
    const float host = Bf16BitsToFloat32(static_cast<uint16_t>(b));
    if (std::isnan(host)) {
      ASSERT_TRUE(std::isnan(device)) << "pattern " << b;
    } else {
      ASSERT_EQ(std::memcmp(&device, &host, sizeof host), 0) << "pattern " << b;
    }
  }
}

TEST(Bf16StorageTest, RoundingMatchesIncludingTiesAndOverflow) {
  // Every upper half with a set of lower halves covering below / at / above
  // the tie, both parities, zero and the extremes.
  const uint32_t lows[] = {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu, 0x1234u};
  int checked = 0;
  for (uint32_t high = 0; high <= 0xffffu; ++high) {
    for (uint32_t low : lows) {
      const float x = FloatOf((high << 16) | low);
      const uint16_t device = BitsOf(Bf16Storage::Make(x));
      const uint16_t host = Float32ToBf16Bits(x);
      if (std::isnan(x)) {
        ASSERT_TRUE(std::isnan(Bf16BitsToFloat32(device))) << "input bits " << ((high << 16) | low);
        continue;
      }
      ASSERT_EQ(device, host) << "input bits 0x" << std::hex << ((high << 16) | low);
      ++checked;
    }
  }
  EXPECT_GT(checked, 400000);
}

}  // namespace
}  // namespace megatrain::kernels::cuda
