// Rotary position embedding (HF rotate-half) applied in place, with its cos/sin table.
#include "kernels/cpu/rope.h"

#include <cassert>
#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace megatrain::kernels::cpu {

absl::StatusOr<RopeTable> RopeTable::Create(int64_t max_positions, int64_t head_dim, double theta,
                                            const RopeScaling& scaling) {
  if (head_dim <= 0 || head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope head_dim must be positive and even, got ", head_dim));
  }
  if (max_positions < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope max_positions must be >= 1, got ", max_positions));
  }
  if (!(theta > 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat("rope theta must be > 0, got ", theta));
  }
  const int64_t half = head_dim / 2;
  std::vector<double> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[i] =
        RopeInverseFrequency(static_cast<int>(i), static_cast<int>(head_dim), theta, scaling);
  }
  std::vector<float> cos(max_positions * half);
  std::vector<float> sin(max_positions * half);
  for (int64_t pos = 0; pos < max_positions; ++pos) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(pos) * inv_freq[i];
      cos[pos * half + i] = static_cast<float>(std::cos(angle));
      sin[pos * half + i] = static_cast<float>(std::sin(angle));
    }
  }
  return RopeTable(max_positions, head_dim, std::move(cos), std::move(sin));
}

RopeTable::RopeTable(int64_t max_positions, int64_t head_dim, std::vector<float> cos,
                     std::vector<float> sin)
    : max_positions_(max_positions),
      head_dim_(head_dim),
      cos_(std::move(cos)),
      sin_(std::move(sin)) {}

namespace {

template <bool kInverse>
void RotateAll(const RopeTable& table, const int32_t* positions, int64_t n_tokens, int64_t n_heads,
               float* x) {
  const int64_t half = table.half_dim();
  const int64_t head_dim = table.head_dim();
  for (int64_t t = 0; t < n_tokens; ++t) {
    assert(positions[t] >= 0 && positions[t] < table.max_positions());
    const float* c = table.cos_row(positions[t]);
    const float* s = table.sin_row(positions[t]);
    for (int64_t h = 0; h < n_heads; ++h) {
      float* lo = x + (t * n_heads + h) * head_dim;
      float* hi = lo + half;
      for (int64_t i = 0; i < half; ++i) {
        float out_lo;
        float out_hi;
        if constexpr (kInverse) {
          RopeRotateBackward(lo[i], hi[i], c[i], s[i], &out_lo, &out_hi);
        } else {
          RopeRotate(lo[i], hi[i], c[i], s[i], &out_lo, &out_hi);
        }
        lo[i] = out_lo;
        hi[i] = out_hi;
      }
    }
  }
}

}  // namespace

void RopeForward(const RopeTable& table, const int32_t* positions, int64_t n_tokens,
                 int64_t n_heads, float* x) {
  RotateAll<false>(table, positions, n_tokens, n_heads, x);
}

void RopeBackward(const RopeTable& table, const int32_t* positions, int64_t n_tokens,
                  int64_t n_heads, float* dx) {
  RotateAll<true>(table, positions, n_tokens, n_heads, dx);
}

}  // namespace megatrain::kernels::cpu
