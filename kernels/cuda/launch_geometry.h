// Grid/block shapes and thread->element mappings of every CUDA launcher, in plain
// MT_HD code so the kernels use them and a g++ test can replay them on the CPU.
#pragma once

#include <cstdint>

#include "kernels/common/host_device.h"

namespace megatrain::kernels::cuda {

// A launch: grid (blocks_x, blocks_y) of `threads` threads (1-D blocks only).
struct LaunchShape {
  int64_t blocks_x = 0;
  int64_t blocks_y = 1;
  int threads = 0;
};

// Largest grid.x / grid.y the hardware accepts; entry points reject work that
// would need more.
inline constexpr int64_t kMaxGridX = 2147483647;
inline constexpr int64_t kMaxGridY = 65535;

MT_HD int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- Element-wise ops: one element (or one RoPE pair) per thread. ----
inline constexpr int kElementwiseThreads = 256;

MT_HD LaunchShape ElementwiseGrid(int64_t n) {
  return LaunchShape{CeilDiv(n, kElementwiseThreads), 1, kElementwiseThreads};
}

// Flat element of (block, thread); callers skip indices >= n (the tail block).
MT_HD int64_t ElementIndex(int64_t block, int thread, int threads) {
  return block * threads + thread;
}

// RoPE works on pairs (i, i + half) of one head of one token; pair p of a
// [tokens, heads, head_dim] tensor is (token, head, i) in row-major order.
struct RopePair {
  int64_t token;
  int head;
  int i;  // 0 <= i < head_dim / 2
};

MT_HD RopePair RopePairAt(int64_t pair, int heads, int half) {
  const int64_t per_token = static_cast<int64_t>(heads) * half;
  RopePair p;
  p.token = pair / per_token;
  const int64_t rest = pair - p.token * per_token;
  p.head = static_cast<int>(rest / half);
  p.i = static_cast<int>(rest - static_cast<int64_t>(p.head) * half);
  return p;
}

// Offset of the low element of a pair; the high element is at +half.
MT_HD int64_t RopeLowOffset(const RopePair& p, int heads, int head_dim) {
  return (p.token * heads + p.head) * head_dim + p.i;
}

// ---- Embedding forward: one thread per output element (token, column). ----
// Backward: one block column-slice per unique vocabulary row (blockIdx.x =
// unique row, blockIdx.y = column tile), each thread one column.
inline constexpr int kEmbeddingBackwardThreads = 256;

MT_HD LaunchShape EmbeddingBackwardGrid(int64_t unique_rows, int dim) {
  return LaunchShape{unique_rows, CeilDiv(dim, kEmbeddingBackwardThreads),
                     kEmbeddingBackwardThreads};
}

MT_HD int64_t ColumnIndex(int64_t block_y, int thread, int threads) {
  return block_y * threads + thread;
}

// ---- Row-per-block reductions (RMSNorm, cross-entropy): block b owns row b and
// thread t visits columns t, t + threads, ... < cols. ----
inline constexpr int kRowThreads = 256;

MT_HD LaunchShape RowGrid(int64_t rows) { return LaunchShape{rows, 1, kRowThreads}; }

MT_HD int64_t RowFirstColumn(int thread) { return thread; }
MT_HD int64_t RowColumnStride(int threads) { return threads; }

// ---- RMSNorm dw: pass 1 sums fixed groups of rows per column into partials
// [groups, dim]; pass 2 folds the groups in order. The group size is a
// constant, so the summation order depends on the shape only (not on the GPU's
// SM count), which keeps dw bitwise reproducible across devices. ----
inline constexpr int kDwThreads = 256;
inline constexpr int64_t kDwRowsPerGroup = 64;

MT_HD int64_t DwRowGroups(int64_t rows) { return CeilDiv(rows, kDwRowsPerGroup); }

MT_HD LaunchShape DwPartialGrid(int64_t rows, int dim) {
  return LaunchShape{CeilDiv(dim, kDwThreads), DwRowGroups(rows), kDwThreads};
}

MT_HD LaunchShape DwFinalGrid(int dim) {
  return LaunchShape{CeilDiv(dim, kDwThreads), 1, kDwThreads};
}

struct RowRange {
  int64_t begin;
  int64_t end;
};

MT_HD RowRange DwGroupRows(int64_t group, int64_t rows) {
  const int64_t begin = group * kDwRowsPerGroup;
  const int64_t end = begin + kDwRowsPerGroup < rows ? begin + kDwRowsPerGroup : rows;
  return RowRange{begin, end};
}

// ---- Single-block fixed-order sum (cross-entropy loss). Thread t adds
// elements t, t + threads, ... in order; the block then folds the threads. ----
inline constexpr int kSumThreads = 256;

// ---- Attention (FlashAttention-2 style, causal, GQA). Inputs are
// [batch, seq, heads, head_dim]; kThreadsPerRow threads share one query (or
// key) row, thread lane l owning dims l, l + kThreadsPerRow, ... (interleaved
// so the lanes of a row hit different shared-memory banks). ----
inline constexpr int kAttnThreads = 128;
inline constexpr int kAttnThreadsPerRow = 8;
inline constexpr int kAttnRowsPerBlock = kAttnThreads / kAttnThreadsPerRow;  // 16
inline constexpr int kAttnTile = 32;  // keys (forward, dq) or queries (dk/dv) per smem tile

// Forward and dq: grid (query tiles, batch * q_heads). dk/dv: grid (key tiles,
// batch * kv_heads).
MT_HD LaunchShape AttentionGrid(int seq, int batch, int heads) {
  return LaunchShape{CeilDiv(seq, kAttnRowsPerBlock), static_cast<int64_t>(batch) * heads,
                     kAttnThreads};
}

struct AttnRowSlot {
  int row;   // row within the sequence (may be >= seq in the tail block)
  int lane;  // 0 .. kAttnThreadsPerRow-1
};

MT_HD AttnRowSlot AttentionRowSlot(int64_t block_x, int thread) {
  return AttnRowSlot{static_cast<int>(block_x * kAttnRowsPerBlock + thread / kAttnThreadsPerRow),
                     thread % kAttnThreadsPerRow};
}

// Offset of (b, s, h, 0) in a [batch, seq, heads, head_dim] tensor.
MT_HD int64_t BshdOffset(int b, int s, int h, int seq, int heads, int head_dim) {
  return ((static_cast<int64_t>(b) * seq + s) * heads + h) * head_dim;
}

// Causal: the last key a block of query rows [first_row, first_row + rows)
// can see, +1 (exclusive), capped at seq.
MT_HD int CausalKeyEnd(int first_row, int rows, int seq) {
  const int end = first_row + rows;
  return end < seq ? end : seq;
}

}  // namespace megatrain::kernels::cuda
