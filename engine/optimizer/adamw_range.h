// AdamW over one contiguous range of elements, per SIMD instruction set; every
// variant gives bit-identical results to kernels::AdamwUpdate for every element.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/optimizer/simd_isa.h"
#include "kernels/common/adamw.h"

namespace megatrain::engine {

// Updates param/m/v[0, count) in place from grad[0, count). When
// compute_copy_bf16 is non-null it also receives the new param rounded to
// bf16 (nearest, ties to even; kernels::Float32ToBf16Bits). isa must be
// supported by this CPU (SimdIsaSupported). No alignment is required.
void AdamwRange(SimdIsa isa, const kernels::AdamwStepScalars& s, size_t count, float* param,
                float* m, float* v, const float* grad, uint16_t* compute_copy_bf16);

}  // namespace megatrain::engine
