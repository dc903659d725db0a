// Host embedding gather / scatter-add (see host_embedding.h).
#include "engine/exec/host_embedding.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "kernels/cpu/embedding.h"

namespace megatrain::engine {
namespace {

// Zeroing the whole fp32 table is the bulk of a first contribution (2.2 GB for
// Qwen2.5-7B's 152064 x 3584 table): one thread took 262 ms of a 1.2 s step on
// the first H100 run (2026-11-27), at the end of the backward where nothing
// hides it. Memory bandwidth grows with threads, so large tables are cleared in
// parallel chunks; the result is the same zeros either way.
void ZeroTable(float* grad, size_t floats) {
  constexpr size_t kParallelFrom = size_t{64} << 20;  // bytes
  constexpr unsigned kMaxThreads = 8;
  const size_t bytes = floats * sizeof(float);
  const unsigned threads = std::min(kMaxThreads, std::max(1u, std::thread::hardware_concurrency()));
  if (bytes < kParallelFrom || threads == 1) {
    std::memset(grad, 0, bytes);
    return;
  }
  const size_t chunk = (floats + threads - 1) / threads;
  std::vector<std::jthread> workers;
  workers.reserve(threads - 1);
  for (unsigned i = 1; i < threads; ++i) {
    const size_t begin = std::min(floats, i * chunk);
    const size_t count = std::min(floats, begin + chunk) - begin;
    workers.emplace_back([grad, begin, count] { std::memset(grad + begin, 0, count * sizeof(float)); });
  }
  std::memset(grad, 0, std::min(floats, chunk) * sizeof(float));
}

}  // namespace

void GatherEmbeddingRows(const float* table, int64_t vocab, int64_t dim, const int32_t* ids,
                         int64_t tokens, float* rows) {
  kernels::cpu::EmbeddingForward(table, vocab, dim, ids, tokens, rows);
}

void ScatterAddEmbeddingRows(const float* d_rows, const int32_t* ids, int64_t tokens, int64_t vocab,
                             int64_t dim, bool first_contribution, float* grad) {
  if (first_contribution) {
    ZeroTable(grad, static_cast<size_t>(vocab * dim));
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
