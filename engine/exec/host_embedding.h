// The embedding stages on the host: gather the micro-batch's rows of the
// table (so only tokens x d crosses the link, never vocab x d) and add the
// rows' gradients back into the table's gradient slab.
#pragma once

#include <cstdint>

namespace megatrain::engine {

// rows[t, :] = table[ids[t], :].
void GatherEmbeddingRows(const float* table, int64_t vocab, int64_t dim, const int32_t* ids,
                         int64_t tokens, float* rows);

// Adds d rows[t, :] into grad[ids[t], :]. Each table row receives the sum of
// its tokens' rows in token order, started from zero, and then that sum is
// stored (first_contribution: every other row becomes zero) or added to the
// slab — exactly what a device-side scatter into a zeroed buffer followed by
// a copy or an add into the slab computes, bit for bit.
// Large scatters run on host threads (id groups split among them: disjoint rows, so the bits do
// not depend on how many); `threads` 0 = HostChunkThreads().
void ScatterAddEmbeddingRows(const float* d_rows, const int32_t* ids, int64_t tokens, int64_t vocab,
                             int64_t dim, bool first_contribution, float* grad,
                             unsigned threads = 0);

// The same from bf16 rows (a GPU's embedding gradient as it comes off the device), widened as
// they are summed: the bits of ScatterAddEmbeddingRows over the rows widened to fp32 first,
// without that pass over an fp32 copy (tokens x dim x 4 bytes written and read again).
void ScatterAddEmbeddingRowsBf16(const uint16_t* d_rows_bf16, const int32_t* ids, int64_t tokens,
                                 int64_t vocab, int64_t dim, bool first_contribution, float* grad,
                                 unsigned threads = 0);

}  // namespace megatrain::engine
