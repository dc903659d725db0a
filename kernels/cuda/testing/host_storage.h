// Storage policies (see kernels/cuda/thread_bodies.h) for replaying the kernel bodies on the
// host: plain float, and bf16 as raw bits, the host twin of bf16_storage.h (both round to
// nearest even; bf16_storage_test compares the two bitwise). kOutputRounding is the relative
// error one store may add: 0 for float, half a bf16 ulp for bf16.
#pragma once

#include <cstdint>

#include "kernels/common/bf16.h"

namespace megatrain::kernels::cuda::testing {

struct FloatStorage {
  using T = float;
  static constexpr double kOutputRounding = 0.0;
  static float Load(float v) { return v; }
  static float Make(float v) { return v; }
};

struct Bf16BitsStorage {
  using T = uint16_t;
  static constexpr double kOutputRounding = 1.0 / 256.0;
  static float Load(uint16_t v) { return Bf16BitsToFloat32(v); }
  static uint16_t Make(float v) { return Float32ToBf16Bits(v); }
};

}  // namespace megatrain::kernels::cuda::testing
