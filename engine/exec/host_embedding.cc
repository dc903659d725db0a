// Host embedding gather / scatter-add (see host_embedding.h).
#include "engine/exec/host_embedding.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "kernels/cpu/embedding.h"

namespace megatrain::engine {

void GatherEmbeddingRows(const float* table, int64_t vocab, int64_t dim, const int32_t* ids,
                         int64_t tokens, float* rows) {
  kernels::cpu::EmbeddingForward(table, vocab, dim, ids, tokens, rows);
}

void ScatterAddEmbeddingRows(const float* d_rows, const int32_t* ids, int64_t tokens, int64_t vocab,
                             int64_t dim, bool first_contribution, float* grad) {
  if (first_contribution) {
    std::memset(grad, 0, static_cast<size_t>(vocab * dim) * sizeof(float));
    kernels::cpu::EmbeddingBackward(d_rows, ids, tokens, vocab, dim, grad);
    return;
  }
  // Tokens grouped by id, token order kept inside a group.
  std::vector<int64_t> order(static_cast<size_t>(tokens));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [ids](int64_t a, int64_t b) { return ids[a] < ids[b]; });
  std::vector<float> sum(static_cast<size_t>(dim));
  for (size_t i = 0; i < order.size();) {
    const int32_t id = ids[order[i]];
    std::fill(sum.begin(), sum.end(), 0.0f);
    for (; i < order.size() && ids[order[i]] == id; ++i) {
      const float* row = d_rows + order[i] * dim;
      for (int64_t j = 0; j < dim; ++j) sum[j] += row[j];
    }
    float* out = grad + static_cast<int64_t>(id) * dim;
    for (int64_t j = 0; j < dim; ++j) out[j] += sum[j];
  }
}

}  // namespace megatrain::engine
