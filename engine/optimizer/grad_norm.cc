// Gradient sum of squares (scalar, AVX2, AVX-512 bodies of one fixed scheme),
// global norm and clip coefficient.
#include "engine/optimizer/grad_norm.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace megatrain::engine {
namespace {

using Lanes = double[kGradNormLanes];

// Adds x[j]^2 to lanes[j % 16] for j in [0, count); callers pass count from a
// multiple of kGradNormLanes within the chunk so lane numbering is preserved.
void AccumulateScalar(const float* x, size_t count, Lanes lanes) {
  for (size_t j = 0; j < count; ++j) {
    const double d = x[j];
    lanes[j % kGradNormLanes] += d * d;
  }
}

double CombineLanes(const Lanes lanes) {
  double sum = 0.0;
  for (size_t k = 0; k < kGradNormLanes; ++k) sum += lanes[k];
  return sum;
}

double ChunkSumScalar(const float* x, size_t count) {
  Lanes lanes = {};
  AccumulateScalar(x, count, lanes);
  return CombineLanes(lanes);
}

double ChunkSumAvx2(const float* x, size_t count) {
  __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                    _mm256_setzero_pd()};
  size_t j = 0;
  for (; j + kGradNormLanes <= count; j += kGradNormLanes) {
    for (int q = 0; q < 4; ++q) {
      const __m256d d = _mm256_cvtps_pd(_mm_loadu_ps(x + j + 4 * q));
      acc[q] = _mm256_add_pd(acc[q], _mm256_mul_pd(d, d));
    }
  }
  Lanes lanes;
  for (int q = 0; q < 4; ++q) _mm256_storeu_pd(lanes + 4 * q, acc[q]);
  AccumulateScalar(x + j, count - j, lanes);
  return CombineLanes(lanes);
}

__attribute__((target("avx512f"))) double ChunkSumAvx512(const float* x, size_t count) {
  __m512d acc_lo = _mm512_setzero_pd();
  __m512d acc_hi = _mm512_setzero_pd();
  // The all-lanes maskz form avoids a GCC 12 -Wmaybe-uninitialized false
  // positive inside the unmasked intrinsic; same instruction.
  constexpr __mmask8 kAll = 0xff;
  size_t j = 0;
  for (; j + kGradNormLanes <= count; j += kGradNormLanes) {
    const __m512d lo = _mm512_maskz_cvtps_pd(kAll, _mm256_loadu_ps(x + j));
    const __m512d hi = _mm512_maskz_cvtps_pd(kAll, _mm256_loadu_ps(x + j + 8));
    acc_lo = _mm512_add_pd(acc_lo, _mm512_mul_pd(lo, lo));
    acc_hi = _mm512_add_pd(acc_hi, _mm512_mul_pd(hi, hi));
  }
  Lanes lanes;
  _mm512_storeu_pd(lanes, acc_lo);
  _mm512_storeu_pd(lanes + 8, acc_hi);
  AccumulateScalar(x + j, count - j, lanes);
  return CombineLanes(lanes);
}

double ChunkSum(SimdIsa isa, const float* x, size_t count) {
  switch (isa) {
    case SimdIsa::kScalar:
      return ChunkSumScalar(x, count);
    case SimdIsa::kAvx2:
      return ChunkSumAvx2(x, count);
    case SimdIsa::kAvx512:
      return ChunkSumAvx512(x, count);
  }
  std::abort();
}

}  // namespace

void GradChunkSumsOfSquares(absl::Span<const float> grad, ThreadPool* pool, double* partials,
                            SimdIsa isa) {
  if (!SimdIsaSupported(isa)) {
    std::fprintf(stderr, "GradSumOfSquares: SIMD instruction set %d not supported\n",
                 static_cast<int>(isa));
    std::abort();
  }
  const size_t n_chunks = (grad.size() + kGradNormChunkElements - 1) / kGradNormChunkElements;
  auto run_chunk = [&](size_t c) {
    const size_t begin = c * kGradNormChunkElements;
    const size_t count = std::min(kGradNormChunkElements, grad.size() - begin);
    partials[c] = ChunkSum(isa, grad.data() + begin, count);
  };
  if (pool == nullptr) {
    for (size_t c = 0; c < n_chunks; ++c) run_chunk(c);
  } else {
    pool->ParallelFor(n_chunks, run_chunk);
  }
}

double SumPartials(absl::Span<const double> partials) {
  double sum = 0.0;
  for (double partial : partials) sum += partial;
  return sum;
}

double GradSumOfSquares(absl::Span<const float> grad, ThreadPool* pool, SimdIsa isa) {
  std::vector<double> partials((grad.size() + kGradNormChunkElements - 1) /
                               kGradNormChunkElements);
  GradChunkSumsOfSquares(grad, pool, partials.data(), isa);
  return SumPartials(partials);
}

double GlobalGradNorm(absl::Span<const double> per_layer_sum_of_squares) {
  double sum = 0.0;
  for (double s : per_layer_sum_of_squares) sum += s;
  return std::sqrt(sum);
}

double ClipCoefficient(double total_norm, double max_norm) {
  return std::min(1.0, max_norm / (total_norm + 1e-6));
}

bool GradNormIsFinite(double total_norm) { return std::isfinite(total_norm); }

}  // namespace megatrain::engine
