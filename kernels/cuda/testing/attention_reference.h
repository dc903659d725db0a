// Naive causal grouped-query attention in double precision, forward and backward, with optional
// segment ids: the reference the CUDA attention bodies (emulated here, or on a GPU) are checked
// against. Layouts as the kernels': q, out, dq [batch, seq, q_heads, head_dim]; k, v, dk, dv
// [batch, seq, kv_heads, head_dim]; lse [batch, q_heads, seq] (natural log, scaled scores).
#pragma once

#include <cstdint>
#include <vector>

namespace megatrain::kernels::cuda::testing {

struct AttentionReferenceShape {
  int batch = 0;
  int seq = 0;
  int q_heads = 0;  // a multiple of kv_heads; query head h reads kv head h / (q_heads / kv_heads)
  int kv_heads = 0;
  int head_dim = 0;
  double scale = 0.0;  // softmax scale
};

struct AttentionReferenceResult {
  std::vector<double> out, lse, dq, dk, dv;
};

// Key j is visible to query i iff j <= i and, with `segments` [batch, seq] not empty, both lie in
// the same segment. The backward's delta is sum_d dout * out with out in double.
AttentionReferenceResult ReferenceAttention(const AttentionReferenceShape& shape,
                                            const std::vector<float>& q,
                                            const std::vector<float>& k,
                                            const std::vector<float>& v,
                                            const std::vector<float>& dout,
                                            const std::vector<int32_t>& segments = {});

}  // namespace megatrain::kernels::cuda::testing
