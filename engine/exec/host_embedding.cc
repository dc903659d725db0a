// Host embedding gather / scatter-add (see host_embedding.h).
#include "engine/exec/host_embedding.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "engine/common/parallel_chunks.h"
#include "kernels/common/bf16.h"
#include "kernels/cpu/embedding.h"

namespace megatrain::engine {
namespace {

// Below this much work (floats touched) one thread does it: thread start-up would dominate.
constexpr size_t kParallelFloats = size_t{1} << 20;

// Zeroing the whole fp32 table is the bulk of a first contribution (2.2 GB for Qwen2.5-7B's
// 152064 x 3584 table): one thread took 262 ms of a 1.2 s step on the first H100 run
// (2026-11-27), at the end of the backward where nothing hides it. Memory bandwidth grows with
// threads, so large tables are cleared in parallel chunks; the result is the same zeros.
void ZeroTable(float* grad, size_t floats, unsigned max_threads) {
  const unsigned threads = floats >= 16 * kParallelFloats ? max_threads : 1;
  RunInChunksOnThreads(floats, threads, 1024, [grad](size_t begin, size_t end) {
    std::memset(grad + begin, 0, (end - begin) * sizeof(float));
  });
}

}  // namespace

void GatherEmbeddingRows(const float* table, int64_t vocab, int64_t dim, const int32_t* ids,
                         int64_t tokens, float* rows) {
  kernels::cpu::EmbeddingForward(table, vocab, dim, ids, tokens, rows);
}

namespace {

// The scatter of both row formats: `row_value(t, j)` is token t's gradient at column j as a
// float (a bf16 value widens exactly, so either format gives the bits of its fp32 rows).
template <typename RowValue>
void ScatterAddRows(RowValue row_value, const int32_t* ids, int64_t tokens, int64_t vocab,
                    int64_t dim, bool first_contribution, float* grad, unsigned max_threads) {
  if (max_threads == 0) max_threads = HostChunkThreads();
  if (first_contribution) ZeroTable(grad, static_cast<size_t>(vocab * dim), max_threads);
  // Tokens grouped by id, token order kept inside a group. Each table row is then the sum of
  // its group, from 0 in token order, stored (first contribution) or added: per row the same
  // operations as a scatter into a zeroed buffer, so splitting the groups over threads
  // (disjoint rows) changes no bit.
  std::vector<int64_t> order(static_cast<size_t>(tokens));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [ids](int64_t a, int64_t b) { return ids[a] < ids[b]; });
  std::vector<size_t> group_starts;  // index into `order` where each id's group begins
  for (size_t i = 0; i < order.size(); ++i) {
    if (i == 0 || ids[order[i]] != ids[order[i - 1]]) group_starts.push_back(i);
  }
  const size_t groups = group_starts.size();
  group_starts.push_back(order.size());
  const unsigned threads = static_cast<size_t>(tokens * dim) >= kParallelFloats ? max_threads : 1;
  RunInChunksOnThreads(groups, threads, 1, [&](size_t first_group, size_t end_group) {
    std::vector<float> sum(static_cast<size_t>(dim));
    for (size_t g = first_group; g < end_group; ++g) {
      std::fill(sum.begin(), sum.end(), 0.0f);
      for (size_t i = group_starts[g]; i < group_starts[g + 1]; ++i) {
        const int64_t t = order[i];
        for (int64_t j = 0; j < dim; ++j) sum[j] += row_value(t, j);
      }
      float* out = grad + static_cast<int64_t>(ids[order[group_starts[g]]]) * dim;
      if (first_contribution) {
        std::copy(sum.begin(), sum.end(), out);
      } else {
        for (int64_t j = 0; j < dim; ++j) out[j] += sum[j];
      }
    }
  });
}

}  // namespace

void ScatterAddEmbeddingRows(const float* d_rows, const int32_t* ids, int64_t tokens, int64_t vocab,
                             int64_t dim, bool first_contribution, float* grad,
                             unsigned max_threads) {
  ScatterAddRows([d_rows, dim](int64_t t, int64_t j) { return d_rows[t * dim + j]; }, ids, tokens,
                 vocab, dim, first_contribution, grad, max_threads);
}

void ScatterAddEmbeddingRowsBf16(const uint16_t* d_rows_bf16, const int32_t* ids, int64_t tokens,
                                 int64_t vocab, int64_t dim, bool first_contribution, float* grad,
                                 unsigned max_threads) {
  ScatterAddRows(
      [d_rows_bf16, dim](int64_t t, int64_t j) {
        return kernels::Bf16BitsToFloat32(d_rows_bf16[t * dim + j]);
      },
      ids, tokens, vocab, dim, first_contribution, grad, max_threads);
}

}  // namespace megatrain::engine
