// AdamW over one contiguous range of elements, per SIMD instruction set; every
// variant gives bit-identical results to kernels::AdamwUpdate for every element.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/optimizer/simd_isa.h"
#include "kernels/common/adamw.h"

namespace megatrain::engine {

// The arrays of one AdamW range: the current param, m and v, read, and where their new values
// go. In place when each output is its input; out of place (the speculative update's form: the
// current state stays untouched) an output must not partly overlap any input.
struct AdamwArrays {
  const float* param = nullptr;
  const float* m = nullptr;
  const float* v = nullptr;
  float* param_out = nullptr;
  float* m_out = nullptr;
  float* v_out = nullptr;

  static AdamwArrays InPlace(float* param, float* m, float* v) {
    return {param, m, v, param, m, v};
  }
  // The same arrays from element i on.
  AdamwArrays From(size_t i) const {
    return {param + i, m + i, v + i, param_out + i, m_out + i, v_out + i};
  }
};

// Writes the new param/m/v of elements [0, count) (AdamwArrays) from grad[0, count). When
// compute_copy_bf16 is non-null it also receives the new param rounded to bf16 (nearest, ties
// to even; kernels::Float32ToBf16Bits). In place and out of place run the same instructions, so
// they give the same bits. isa must be supported by this CPU (SimdIsaSupported). No alignment
// is required.
void AdamwRangeTo(SimdIsa isa, const kernels::AdamwStepScalars& s, size_t count,
                  const AdamwArrays& arrays, const float* grad, uint16_t* compute_copy_bf16);

// AdamwRangeTo in place: param/m/v[0, count) updated where they are.
inline void AdamwRange(SimdIsa isa, const kernels::AdamwStepScalars& s, size_t count,
                       float* param, float* m, float* v, const float* grad,
                       uint16_t* compute_copy_bf16) {
  AdamwRangeTo(isa, s, count, AdamwArrays::InPlace(param, m, v), grad, compute_copy_bf16);
}

}  // namespace megatrain::engine
