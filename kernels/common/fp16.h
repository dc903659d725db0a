// IEEE binary16 <-> float32 element conversion (exact widening, round-to-nearest-even
// narrowing), shared by both backends.
#pragma once

#include <cstdint>

#include "kernels/common/bf16.h"
#include "kernels/common/host_device.h"

namespace megatrain::kernels {

// Exact for every binary16 value: normals, subnormals (rescaled into float32
// normals), signed zeros, infinities and NaNs (payload kept in the top
// mantissa bits).
MT_HD float Float16BitsToFloat32(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) return FloatFromBits(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return FloatFromBits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  if (mantissa == 0) return FloatFromBits(sign);
  // Subnormal: value = mantissa * 2^-24; shift the leading one into the
  // implicit-bit position and lower the float32 exponent by the same amount.
  int32_t e = 113;  // float32 biased exponent of 2^-14, the subnormal scale
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    --e;
  }
  return FloatFromBits(sign | (static_cast<uint32_t>(e) << 23) | ((mantissa & 0x3ffu) << 13));
}

// Round to nearest, ties to even. Overflow gives +-inf; results below the
// smallest subnormal round to +-0; NaN stays a quiet NaN with its sign.
MT_HD uint16_t Float32ToFloat16Bits(float x) {
  const uint32_t bits = FloatBits(x);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65536: inf
  const int32_t exponent = static_cast<int32_t>(abs >> 23) - 127;
  if (exponent >= -14) {
    // Normal binary16 range: drop 13 mantissa bits with RNE; a carry into the
    // exponent (including up to inf) is the correct rounding.
    const uint32_t rebased = abs - (112u << 23);
    const uint32_t lsb = (rebased >> 13) & 1u;
    return static_cast<uint16_t>(sign | ((rebased + 0xfffu + lsb) >> 13));
  }
  if (exponent < -25) return sign;  // below half the smallest subnormal
  // Subnormal: the result is round(value * 2^24) with the implicit bit made
  // explicit; shift is in [14, 24].
  const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t shift = static_cast<uint32_t>(-exponent - 1);
  const uint32_t truncated = mantissa >> shift;
  const uint32_t remainder = mantissa & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  const uint32_t rounded =
      truncated + ((remainder > half || (remainder == half && (truncated & 1u))) ? 1u : 0u);
  return static_cast<uint16_t>(sign | rounded);
}

}  // namespace megatrain::kernels
