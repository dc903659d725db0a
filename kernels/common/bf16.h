// bfloat16 <-> float32 element conversion (round-to-nearest-even), shared by both backends.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/common/host_device.h"

namespace megatrain::kernels {

MT_HD uint32_t FloatBits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
#endif
}

MT_HD float FloatFromBits(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
#endif
}

// bf16 is the top half of a float32, so widening is exact for every value
// (NaN payloads included).
MT_HD float Bf16BitsToFloat32(uint16_t bits) { return FloatFromBits(uint32_t{bits} << 16); }

// Round to nearest, ties to even, on the 16 dropped bits. Finite values whose
// rounding carries past the largest bf16 become inf (as torch does). NaN stays
// NaN with its sign and top payload bits, forced quiet so truncation can never
// turn it into inf.
MT_HD uint16_t Float32ToBf16Bits(float x) {
  const uint32_t bits = FloatBits(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7fffu + lsb) >> 16);
}

}  // namespace megatrain::kernels
