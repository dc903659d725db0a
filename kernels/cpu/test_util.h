// Test helpers for the CPU kernels: seeded random inputs and element-wise
// comparison of fp32 results against double-precision references.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace megatrain::kernels::cpu::testing {

// Uniform values in [lo, hi), reproducible from the seed.
inline std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::vector<float> values(n);
  for (float& x : values) {
    const double unit = static_cast<double>(gen()) / 4294967296.0;
    x = static_cast<float>(lo + (hi - lo) * unit);
  }
  return values;
}

inline std::vector<double> ToDouble(const std::vector<float>& values) {
  return std::vector<double>(values.begin(), values.end());
}

// Passes iff |got - want| <= abs_tol + rel_tol * |want| for every element;
// reports the count of failures and the first few.
inline ::testing::AssertionResult AllClose(const float* got, const double* want, size_t n,
                                           double abs_tol, double rel_tol) {
  size_t failures = 0;
  std::string report;
  double worst = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double bound = abs_tol + rel_tol * std::fabs(want[i]);
    worst = std::max(worst, err);
    if (!(err <= bound)) {
      if (++failures <= 5) {
        report += "\n  [" + std::to_string(i) + "] got " + std::to_string(got[i]) + " want " +
                  std::to_string(want[i]) + " err " + std::to_string(err);
      }
    }
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << failures << " of " << n << " elements off (max err " << worst << ")" << report;
}

inline ::testing::AssertionResult AllClose(const std::vector<float>& got,
                                           const std::vector<double>& want, double abs_tol,
                                           double rel_tol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  }
  return AllClose(got.data(), want.data(), got.size(), abs_tol, rel_tol);
}

inline bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace megatrain::kernels::cpu::testing
