// AdamW range kernels: scalar, AVX2 and AVX-512 bodies.
//
// Bit-exactness contract: the vector bodies use separate multiply and add
// instructions in exactly the order of kernels::AdamwUpdate, and this file is
// compiled with -ffp-contract=off so neither the scalar path nor GCC's
// vector-extension intrinsics are fused into FMAs. sqrt and division are
// correctly rounded in both scalar and vector form, so every element gets the
// same bits whichever body (or tail) handles it.
//
// Division by the per-step constant sqrt(1 - beta2^t) is the one exception to
// "same instructions": when that constant is a power of two (it rounds to
// exactly 1.0f from step 325 at beta2 = 0.95 and from step 16628 at 0.999:
// most of a long run) the vector bodies multiply by its reciprocal instead.
// x / 2^k and x * 2^-k are correct roundings of the same real number, so the
// bits are the same for every x (zeros, subnormals, infinities and NaNs
// included), and the loop does one divider operation fewer per element: the
// sqrt and the two divisions share one divider and bound the in-cache speed
// (0.39 -> 0.29 ns/element per core, AVX-512, on this machine).
#include "engine/optimizer/adamw_range.h"

#include <immintrin.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/common/bf16.h"

namespace megatrain::engine {
namespace {

using kernels::AdamwStepScalars;

// flatten forces AdamwUpdate inline here, so it is compiled with this file's
// -ffp-contract=off rather than taken from another translation unit.
__attribute__((flatten)) void AdamwRangeScalar(const AdamwStepScalars& s, size_t count,
                                               const AdamwArrays& a, const float* grad,
                                               uint16_t* bf16) {
  for (size_t i = 0; i < count; ++i) {
    kernels::AdamwUpdateTo(s, grad[i], a.param[i], a.m[i], a.v[i], &a.param_out[i], &a.m_out[i],
                           &a.v_out[i]);
    if (bf16 != nullptr) bf16[i] = kernels::Float32ToBf16Bits(a.param_out[i]);
  }
}

// The compute copy is written and not read again in this pass, so aligned
// copies go out with non-temporal stores: no read-for-ownership of lines
// that are about to be overwritten whole.
bool IsAligned(const uint16_t* p, uintptr_t bytes) {
  return p != nullptr && reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Per-step constants, each computed exactly as AdamwUpdate computes it.
struct AdamwConstants {
  float grad_scale, decay_factor, beta1, one_minus_beta1, beta2, one_minus_beta2,
      bias_correction2_sqrt, eps, step_size;
};

AdamwConstants MakeConstants(const AdamwStepScalars& s) {
  return {s.grad_scale,   1.0f - s.lr * s.weight_decay, s.beta1, 1.0f - s.beta1, s.beta2,
          1.0f - s.beta2, s.bias_correction2_sqrt,      s.eps,   s.step_size};
}

// True when x is 2^k with 2^k and 2^-k both normal floats, so that dividing
// by x and multiplying by 1 / x round identically.
bool IsPowerOfTwoWithNormalInverse(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const uint32_t biased_exponent = bits >> 23;  // sign bit set -> > 253
  return (bits & 0x7fffff) == 0 && biased_exponent >= 1 && biased_exponent <= 253;
}

// kScaleByInverse: bias_correction2_sqrt is a power of two (see the top).
template <bool kScaleByInverse>
void AdamwRangeAvx2(const AdamwStepScalars& s, size_t count, const AdamwArrays& a,
                    const float* grad, uint16_t* bf16) {
  const AdamwConstants c = MakeConstants(s);
  const __m256 grad_scale = _mm256_set1_ps(c.grad_scale);
  const __m256 decay_factor = _mm256_set1_ps(c.decay_factor);
  const __m256 beta1 = _mm256_set1_ps(c.beta1);
  const __m256 one_minus_beta1 = _mm256_set1_ps(c.one_minus_beta1);
  const __m256 beta2 = _mm256_set1_ps(c.beta2);
  const __m256 one_minus_beta2 = _mm256_set1_ps(c.one_minus_beta2);
  const __m256 bc2_sqrt = _mm256_set1_ps(c.bias_correction2_sqrt);
  const __m256 bc2_sqrt_inverse = _mm256_set1_ps(1.0f / c.bias_correction2_sqrt);
  const __m256 eps = _mm256_set1_ps(c.eps);
  const __m256 step_size = _mm256_set1_ps(c.step_size);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i inf_bits = _mm256_set1_epi32(0x7f800000);
  const __m256i round_bias = _mm256_set1_epi32(0x7fff);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i quiet_bit = _mm256_set1_epi32(0x0040);
  const bool stream_copy = IsAligned(bf16, 16);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(grad + i), grad_scale);
    __m256 p = _mm256_mul_ps(_mm256_loadu_ps(a.param + i), decay_factor);
    const __m256 m_new = _mm256_add_ps(_mm256_mul_ps(beta1, _mm256_loadu_ps(a.m + i)),
                                       _mm256_mul_ps(one_minus_beta1, g));
    const __m256 v_new = _mm256_add_ps(_mm256_mul_ps(beta2, _mm256_loadu_ps(a.v + i)),
                                       _mm256_mul_ps(one_minus_beta2, _mm256_mul_ps(g, g)));
    const __m256 root = _mm256_sqrt_ps(v_new);
    const __m256 denom = _mm256_add_ps(
        kScaleByInverse ? _mm256_mul_ps(root, bc2_sqrt_inverse) : _mm256_div_ps(root, bc2_sqrt),
        eps);
    p = _mm256_sub_ps(p, _mm256_mul_ps(step_size, _mm256_div_ps(m_new, denom)));
    _mm256_storeu_ps(a.param_out + i, p);
    _mm256_storeu_ps(a.m_out + i, m_new);
    _mm256_storeu_ps(a.v_out + i, v_new);
    if (bf16 != nullptr) {
      const __m256i bits = _mm256_castps_si256(p);
      const __m256i hi = _mm256_srli_epi32(bits, 16);
      const __m256i rounded = _mm256_srli_epi32(
          _mm256_add_epi32(_mm256_add_epi32(bits, round_bias), _mm256_and_si256(hi, one)), 16);
      const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, abs_mask), inf_bits);
      const __m256i out = _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, quiet_bit), is_nan);
      const __m128i packed =
          _mm_packus_epi32(_mm256_castsi256_si128(out), _mm256_extracti128_si256(out, 1));
      if (stream_copy) {
        _mm_stream_si128(reinterpret_cast<__m128i*>(bf16 + i), packed);
      } else {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(bf16 + i), packed);
      }
    }
  }
  if (stream_copy) _mm_sfence();
  AdamwRangeScalar(s, count - i, a.From(i), grad + i, bf16 == nullptr ? nullptr : bf16 + i);
}

template <bool kScaleByInverse>
__attribute__((target("avx512f"))) void AdamwRangeAvx512(const AdamwStepScalars& s, size_t count,
                                                         const AdamwArrays& a, const float* grad,
                                                         uint16_t* bf16) {
  const AdamwConstants c = MakeConstants(s);
  const __m512 grad_scale = _mm512_set1_ps(c.grad_scale);
  const __m512 decay_factor = _mm512_set1_ps(c.decay_factor);
  const __m512 beta1 = _mm512_set1_ps(c.beta1);
  const __m512 one_minus_beta1 = _mm512_set1_ps(c.one_minus_beta1);
  const __m512 beta2 = _mm512_set1_ps(c.beta2);
  const __m512 one_minus_beta2 = _mm512_set1_ps(c.one_minus_beta2);
  const __m512 bc2_sqrt = _mm512_set1_ps(c.bias_correction2_sqrt);
  const __m512 bc2_sqrt_inverse = _mm512_set1_ps(1.0f / c.bias_correction2_sqrt);
  const __m512 eps = _mm512_set1_ps(c.eps);
  const __m512 step_size = _mm512_set1_ps(c.step_size);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i inf_bits = _mm512_set1_epi32(0x7f800000);
  const __m512i round_bias = _mm512_set1_epi32(0x7fff);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i quiet_bit = _mm512_set1_epi32(0x0040);
  // GCC 12's unmasked AVX-512 intrinsics trip -Wmaybe-uninitialized inside
  // its own headers; the all-lanes maskz forms below are the same instructions.
  constexpr __mmask16 kAll = 0xffff;
  const bool stream_copy = IsAligned(bf16, 32);
  size_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m512 g = _mm512_mul_ps(_mm512_loadu_ps(grad + i), grad_scale);
    __m512 p = _mm512_mul_ps(_mm512_loadu_ps(a.param + i), decay_factor);
    const __m512 m_new = _mm512_add_ps(_mm512_mul_ps(beta1, _mm512_loadu_ps(a.m + i)),
                                       _mm512_mul_ps(one_minus_beta1, g));
    const __m512 v_new = _mm512_add_ps(_mm512_mul_ps(beta2, _mm512_loadu_ps(a.v + i)),
                                       _mm512_mul_ps(one_minus_beta2, _mm512_mul_ps(g, g)));
    const __m512 root = _mm512_maskz_sqrt_ps(kAll, v_new);
    const __m512 denom = _mm512_add_ps(
        kScaleByInverse ? _mm512_mul_ps(root, bc2_sqrt_inverse) : _mm512_div_ps(root, bc2_sqrt),
        eps);
    p = _mm512_sub_ps(p, _mm512_mul_ps(step_size, _mm512_div_ps(m_new, denom)));
    _mm512_storeu_ps(a.param_out + i, p);
    _mm512_storeu_ps(a.m_out + i, m_new);
    _mm512_storeu_ps(a.v_out + i, v_new);
    if (bf16 != nullptr) {
      const __m512i bits = _mm512_castps_si512(p);
      const __m512i hi = _mm512_maskz_srli_epi32(kAll, bits, 16);
      const __m512i rounded = _mm512_maskz_srli_epi32(
          kAll, _mm512_add_epi32(_mm512_add_epi32(bits, round_bias), _mm512_and_si512(hi, one)),
          16);
      const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, abs_mask), inf_bits);
      const __m512i out = _mm512_mask_or_epi32(rounded, is_nan, hi, quiet_bit);
      const __m256i packed = _mm512_maskz_cvtepi32_epi16(kAll, out);
      if (stream_copy) {
        _mm256_stream_si256(reinterpret_cast<__m256i*>(bf16 + i), packed);
      } else {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(bf16 + i), packed);
      }
    }
  }
  if (stream_copy) _mm_sfence();
  AdamwRangeScalar(s, count - i, a.From(i), grad + i, bf16 == nullptr ? nullptr : bf16 + i);
}

}  // namespace

void AdamwRangeTo(SimdIsa isa, const kernels::AdamwStepScalars& s, size_t count,
                  const AdamwArrays& arrays, const float* grad, uint16_t* compute_copy_bf16) {
  switch (isa) {
    case SimdIsa::kScalar:
      return AdamwRangeScalar(s, count, arrays, grad, compute_copy_bf16);
    case SimdIsa::kAvx2:
      return IsPowerOfTwoWithNormalInverse(s.bias_correction2_sqrt)
                 ? AdamwRangeAvx2<true>(s, count, arrays, grad, compute_copy_bf16)
                 : AdamwRangeAvx2<false>(s, count, arrays, grad, compute_copy_bf16);
    case SimdIsa::kAvx512:
      return IsPowerOfTwoWithNormalInverse(s.bias_correction2_sqrt)
                 ? AdamwRangeAvx512<true>(s, count, arrays, grad, compute_copy_bf16)
                 : AdamwRangeAvx512<false>(s, count, arrays, grad, compute_copy_bf16);
  }
  std::fprintf(stderr, "AdamwRangeTo: unknown SimdIsa %d\n", static_cast<int>(isa));
  std::abort();
}

}  // namespace megatrain::engine
