// A vectorisable single-precision exp (Cephes-style range reduction plus a
// degree-6 polynomial, within 2 ulp of expf) for the softmax loops of
// attention and cross-entropy, where libm's scalar expf would dominate.
#pragma once

#include <cstdint>
#include <cstring>

namespace megatrain::kernels::cpu {

// exp(x) for finite x; returns exactly 0 below -87.3 (so exp(-inf) == 0, as
// masked scores need) and NaN for NaN. Pure function of x: deterministic.
inline float FastExp(float x) {
  constexpr float kLowest = -87.3f;  // 2^n stays a normal float down here
  constexpr float kHighest = 88.3f;
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // ln2 split so n * kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to integer
  float xc = x < kLowest ? kLowest : x;
  xc = xc > kHighest ? kHighest : xc;
  const float shifted = xc * kLog2e + kRoundMagic;
  const float n = shifted - kRoundMagic;
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  int32_t shifted_bits;
  std::memcpy(&shifted_bits, &shifted, sizeof(shifted_bits));
  const int32_t exponent_bits = (shifted_bits - 0x4B400000 + 127) << 23;
  float two_to_n;
  std::memcpy(&two_to_n, &exponent_bits, sizeof(two_to_n));
  const float y = p * two_to_n;
  return x < kLowest ? 0.0f : y;
}

}  // namespace megatrain::kernels::cpu
