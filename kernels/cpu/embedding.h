// Token embedding lookup (row gather) and its gradient (ordered scatter-add).
#pragma once

#include <cstdint>

namespace megatrain::kernels::cpu {

// out[t, :] = table[ids[t], :] for t < n_tokens. table is [vocab, dim],
// out is [n_tokens, dim]. Ids must lie in [0, vocab) (the executor validates).
void EmbeddingForward(const float* table, int64_t vocab, int64_t dim, const int32_t* ids,
                      int64_t n_tokens, float* out);

// dtable[ids[t], :] += dout[t, :], tokens in increasing t, so repeated ids add
// up in a fixed order. ACCUMULATES into dtable [vocab, dim].
void EmbeddingBackward(const float* dout, const int32_t* ids, int64_t n_tokens, int64_t vocab,
                       int64_t dim, float* dtable);

}  // namespace megatrain::kernels::cpu
