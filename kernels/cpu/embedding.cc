// Token embedding lookup (row gather) and its gradient (ordered scatter-add).
#include "kernels/cpu/embedding.h"

#include <cassert>
#include <cstring>

namespace megatrain::kernels::cpu {

void EmbeddingForward(const float* table, [[maybe_unused]] int64_t vocab, int64_t dim,
                      const int32_t* ids, int64_t n_tokens, float* out) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    assert(ids[t] >= 0 && ids[t] < vocab);
    std::memcpy(out + t * dim, table + static_cast<int64_t>(ids[t]) * dim,
                static_cast<size_t>(dim) * sizeof(float));
  }
}

void EmbeddingBackward(const float* dout, const int32_t* ids, int64_t n_tokens,
                       [[maybe_unused]] int64_t vocab, int64_t dim, float* dtable) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    assert(ids[t] >= 0 && ids[t] < vocab);
    float* row = dtable + static_cast<int64_t>(ids[t]) * dim;
    const float* grad = dout + t * dim;
    for (int64_t i = 0; i < dim; ++i) row[i] += grad[i];
  }
}

}  // namespace megatrain::kernels::cpu
