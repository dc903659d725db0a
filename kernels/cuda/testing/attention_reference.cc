// The double-precision attention reference: every (query, key) pair visited directly, no tiling.
#include "kernels/cuda/testing/attention_reference.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace megatrain::kernels::cuda::testing {

AttentionReferenceResult ReferenceAttention(const AttentionReferenceShape& s,
                                            const std::vector<float>& q,
                                            const std::vector<float>& k,
                                            const std::vector<float>& v,
                                            const std::vector<float>& dout,
                                            const std::vector<int32_t>& segments) {
  const int dim = s.head_dim, group = s.q_heads / s.kv_heads;
  AttentionReferenceResult r;
  r.out.assign(q.size(), 0.0);
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0);
  r.dv.assign(v.size(), 0.0);
  r.lse.assign(static_cast<size_t>(s.batch) * s.q_heads * s.seq, 0.0);
  auto at_q = [&](int b, int t, int h) {
    return static_cast<size_t>(((int64_t{b} * s.seq + t) * s.q_heads + h) * dim);
  };
  auto at_k = [&](int b, int t, int h) {
    return static_cast<size_t>(((int64_t{b} * s.seq + t) * s.kv_heads + h) * dim);
  };
  std::vector<double> p(static_cast<size_t>(s.seq));
  for (int b = 0; b < s.batch; ++b) {
    auto visible = [&](int i, int j) {
      const size_t row = static_cast<size_t>(b) * s.seq;
      return j <= i && (segments.empty() || segments[row + j] == segments[row + i]);
    };
    for (int h = 0; h < s.q_heads; ++h) {
      const int hk = h / group;
      for (int i = 0; i < s.seq; ++i) {
        const size_t qi = at_q(b, i, h);
        double max_score = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          if (!visible(i, j)) continue;
          double dot = 0.0;
          for (int d = 0; d < dim; ++d) dot += double{q[qi + d]} * k[at_k(b, j, hk) + d];
          p[j] = dot * s.scale;
          max_score = std::max(max_score, p[j]);
        }
        double sum = 0.0;
        for (int j = 0; j <= i; ++j) sum += visible(i, j) ? std::exp(p[j] - max_score) : 0.0;
        const double lse = max_score + std::log(sum);
        r.lse[(static_cast<size_t>(b) * s.q_heads + h) * s.seq + i] = lse;
        for (int j = 0; j <= i; ++j) p[j] = visible(i, j) ? std::exp(p[j] - lse) : 0.0;
        double delta = 0.0;
        for (int d = 0; d < dim; ++d) {
          double acc = 0.0;
          for (int j = 0; j <= i; ++j) acc += p[j] * v[at_k(b, j, hk) + d];
          r.out[qi + d] = acc;
          delta += double{dout[qi + d]} * acc;
        }
        for (int j = 0; j <= i; ++j) {
          if (!visible(i, j)) continue;
          const size_t kj = at_k(b, j, hk);
          double dp = 0.0;
          for (int d = 0; d < dim; ++d) dp += double{dout[qi + d]} * v[kj + d];
          const double ds = p[j] * (dp - delta) * s.scale;
          for (int d = 0; d < dim; ++d) {
            r.dv[kj + d] += p[j] * dout[qi + d];
            r.dq[qi + d] += ds * k[kj + d];
            r.dk[kj + d] += ds * q[qi + d];
          }
        }
      }
    }
  }
  return r;
}

}  // namespace megatrain::kernels::cuda::testing
