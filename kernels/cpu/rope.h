// Rotary position embedding (HF rotate-half) applied in place to [tokens, heads,
// head_dim] activations, with a precomputed cos/sin table.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/common/rope.h"

namespace megatrain::kernels::cpu {

// cos/sin of pos * inv_freq[i] for pos < max_positions, i < head_dim / 2,
// evaluated in double (inv_freq from kernels::RopeInverseFrequency) and
// stored as fp32 [max_positions, head_dim / 2]. Immutable after Create.
class RopeTable {
 public:
  // Errors (InvalidArgument, naming the field) for head_dim not positive and
  // even, max_positions < 1, theta <= 0.
  static absl::StatusOr<RopeTable> Create(int64_t max_positions, int64_t head_dim, double theta,
                                          const RopeScaling& scaling);

  int64_t max_positions() const { return max_positions_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t half_dim() const { return head_dim_ / 2; }
  // Rows of half_dim() values for one position.
  const float* cos_row(int64_t position) const { return cos_.data() + position * half_dim(); }
  const float* sin_row(int64_t position) const { return sin_.data() + position * half_dim(); }

 private:
  RopeTable(int64_t max_positions, int64_t head_dim, std::vector<float> cos,
            std::vector<float> sin);

  int64_t max_positions_;
  int64_t head_dim_;
  std::vector<float> cos_;
  std::vector<float> sin_;
};

// x[t, h, :] rotated by positions[t] for every head, in place. x is
// [n_tokens, n_heads, table.head_dim()]; positions must lie in
// [0, table.max_positions()) (the executor validates).
void RopeForward(const RopeTable& table, const int32_t* positions, int64_t n_tokens,
                 int64_t n_heads, float* x);

// Backward (the inverse rotation), in place on the gradient dx of the same shape.
void RopeBackward(const RopeTable& table, const int32_t* positions, int64_t n_tokens,
                  int64_t n_heads, float* dx);

}  // namespace megatrain::kernels::cpu
