// The NCCL tests' inputs and reference: each rank's deterministic contribution and the double
// sum over ranks with the error bound any fp32 summation order keeps to.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace megatrain::engine::dist::testing {

// Rank r's value i: full-mantissa floats in [-1, 1), different per rank and element.
inline std::vector<float> Contribution(int rank, size_t n) {
  std::vector<float> v(n);
  uint32_t state = 2654435761u * static_cast<uint32_t>(rank + 1) + 977u;
  for (float& x : v) {
    state = state * 1664525u + 1013904223u;
    x = static_cast<float>(state >> 8) / static_cast<float>(1u << 23) - 1.0f;
  }
  return v;
}

// sum[i]: the double sum over `world` ranks of element i. bound[i]: W - 1 fp32 additions, each
// rounding by at most 2^-24 of a partial sum no larger than sum_r |x_r[i]|, whatever the order
// (with W = 1 the bound is 0: the result must be the input, bit for bit).
struct Reference {
  std::vector<double> sum;
  std::vector<double> bound;
};

inline Reference SumOverRanks(int world, size_t n) {
  Reference ref{std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
  for (int r = 0; r < world; ++r) {
    const std::vector<float> x = Contribution(r, n);
    for (size_t i = 0; i < n; ++i) {
      ref.sum[i] += x[i];
      ref.bound[i] += std::fabs(double{x[i]});
    }
  }
  const double additions = static_cast<double>(world - 1);
  for (double& b : ref.bound) b *= additions * std::ldexp(1.0, -24) * (1.0 + 1e-6);
  return ref;
}

// The first index in [0, got.size()) where got[i] misses ref[offset + i] by more than its
// bound (indices past the reference, padding, are not checked), or -1.
inline int64_t FirstMiss(const std::vector<float>& got, const Reference& ref, size_t offset) {
  for (size_t i = 0; i < got.size() && offset + i < ref.sum.size(); ++i) {
    if (!(std::fabs(double{got[i]} - ref.sum[offset + i]) <= ref.bound[offset + i])) {
      return static_cast<int64_t>(i);
    }
  }
  return -1;
}

}  // namespace megatrain::engine::dist::testing
