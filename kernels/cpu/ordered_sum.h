// Reductions with a fixed summation order that the compiler can still
// vectorise: kLanes independent partial sums (lane = index mod kLanes), folded
// in lane order at the end. The order depends only on the length, never on
// the ISA, threads or alignment, so results are bitwise reproducible.
#pragma once

#include <cstdint>

#include "kernels/cpu/fast_exp.h"

namespace megatrain::kernels::cpu {

inline constexpr int kLanes = 16;

inline float FoldLanes(const float (&acc)[kLanes]) {
  float total = 0.0f;
  for (int lane = 0; lane < kLanes; ++lane) total += acc[lane];
  return total;
}

// sum_i a[i] * b[i].
inline float OrderedDot(const float* a, const float* b, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int lane = 0; lane < kLanes; ++lane) acc[lane] += a[i + lane] * b[i + lane];
  }
  for (int lane = 0; i < n; ++i, ++lane) acc[lane] += a[i] * b[i];
  return FoldLanes(acc);
}

// sum_i a[i] * b[i] * c[i].
inline float OrderedDot3(const float* a, const float* b, const float* c, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int lane = 0; lane < kLanes; ++lane) {
      acc[lane] += a[i + lane] * b[i + lane] * c[i + lane];
    }
  }
  for (int lane = 0; i < n; ++i, ++lane) acc[lane] += a[i] * b[i] * c[i];
  return FoldLanes(acc);
}

// max_i a[i] (-inf for n == 0). Max is order-independent; lanes just let it vectorise.
inline float RowMax(const float* a, int64_t n) {
  float acc[kLanes];
  for (int lane = 0; lane < kLanes; ++lane) acc[lane] = -__builtin_inff();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int lane = 0; lane < kLanes; ++lane) {
      acc[lane] = a[i + lane] > acc[lane] ? a[i + lane] : acc[lane];
    }
  }
  for (int lane = 0; i < n; ++i, ++lane) acc[lane] = a[i] > acc[lane] ? a[i] : acc[lane];
  float result = acc[0];
  for (int lane = 1; lane < kLanes; ++lane) result = acc[lane] > result ? acc[lane] : result;
  return result;
}

// sum_i exp(a[i] - shift), a unchanged.
inline float SumExpShifted(const float* a, int64_t n, float shift) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int lane = 0; lane < kLanes; ++lane) acc[lane] += FastExp(a[i + lane] - shift);
  }
  for (int lane = 0; i < n; ++i, ++lane) acc[lane] += FastExp(a[i] - shift);
  return FoldLanes(acc);
}

// a[i] <- exp(a[i] - shift) in place; returns the sum of the new values.
inline float ExpShiftedInPlaceAndSum(float* a, int64_t n, float shift) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int lane = 0; lane < kLanes; ++lane) {
      const float e = FastExp(a[i + lane] - shift);
      a[i + lane] = e;
      acc[lane] += e;
    }
  }
  for (int lane = 0; i < n; ++i, ++lane) {
    const float e = FastExp(a[i] - shift);
    a[i] = e;
    acc[lane] += e;
  }
  return FoldLanes(acc);
}

}  // namespace megatrain::kernels::cpu
