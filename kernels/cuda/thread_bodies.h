// Per-thread work of the element-wise CUDA kernels over kernels/common math,
// templated on the storage type so the .cu kernels run them on bf16 and the
// grid-replay test runs the very same code on the CPU over float.
//
// `S` is a storage policy: S::T is the element type, S::Load(T) -> float and
// S::Make(float) -> T convert (both MT_HD).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/activations.h"
#include "kernels/common/host_device.h"
#include "kernels/common/rmsnorm.h"
#include "kernels/common/rope.h"
#include "kernels/cuda/launch_geometry.h"

namespace megatrain::kernels::cuda {

template <class S>
MT_HD void ResidualAddThread(int64_t i, int64_t n, const typename S::T* a, const typename S::T* b,
                             typename S::T* out) {
  if (i >= n) return;
  out[i] = S::Make(S::Load(a[i]) + S::Load(b[i]));
}

// sum += g in fp32: one IEEE add per element, so the sum is bit for bit the host's
// (kernels/cpu/residual.h ResidualAdd, the executor's host accumulation) on the same values.
MT_HD void AccumulateFp32Thread(int64_t i, int64_t n, const float* g, float* sum) {
  if (i >= n) return;
  sum[i] = sum[i] + g[i];
}

// fp32 -> storage rounding (round-to-nearest-even for bf16).
template <class S>
MT_HD void RoundToStorageThread(int64_t i, int64_t n, const float* in, typename S::T* out) {
  if (i >= n) return;
  out[i] = S::Make(in[i]);
}

template <class S>
MT_HD void SwigluForwardThread(int64_t i, int64_t n, const typename S::T* gate,
                               const typename S::T* up, typename S::T* out) {
  if (i >= n) return;
  out[i] = S::Make(SwigluForward(S::Load(gate[i]), S::Load(up[i])));
}

template <class S>
MT_HD void SwigluBackwardThread(int64_t i, int64_t n, const typename S::T* gate,
                                const typename S::T* up, const typename S::T* dy,
                                typename S::T* d_gate, typename S::T* d_up) {
  if (i >= n) return;
  float dg = 0.0f;
  float du = 0.0f;
  SwigluBackward(S::Load(gate[i]), S::Load(up[i]), S::Load(dy[i]), &dg, &du);
  d_gate[i] = S::Make(dg);
  d_up[i] = S::Make(du);
}

// x: [tokens, heads, head_dim] in place; token t sits at position t % seq, or positions[t]
// (packed samples) when given; cos/sin: [seq, head_dim / 2].
template <class S>
MT_HD void RopeThread(int64_t pair, int64_t pairs, typename S::T* x, int heads, int head_dim,
                      int seq, const float* cos_table, const float* sin_table,
                      const int32_t* positions, bool backward) {
  if (pair >= pairs) return;
  const int half = head_dim / 2;
  const RopePair p = RopePairAt(pair, heads, half);
  const int64_t lo = RopeLowOffset(p, heads, head_dim);
  const int64_t position = positions != nullptr ? positions[p.token] : p.token % seq;
  const int64_t angle = position * half + p.i;
  const float c = cos_table[angle];
  const float s = sin_table[angle];
  float out_lo = 0.0f;
  float out_hi = 0.0f;
  if (backward) {
    RopeRotateBackward(S::Load(x[lo]), S::Load(x[lo + half]), c, s, &out_lo, &out_hi);
  } else {
    RopeRotate(S::Load(x[lo]), S::Load(x[lo + half]), c, s, &out_lo, &out_hi);
  }
  x[lo] = S::Make(out_lo);
  x[lo + half] = S::Make(out_hi);
}

// out[t, c] = table[ids[t], c]; an id outside [0, vocab) poisons its row with
// NaN (a kernel cannot return an error; the non-finite check surfaces it).
template <class S>
MT_HD void EmbeddingForwardThread(int64_t i, int64_t n, const int32_t* ids,
                                  const typename S::T* table, int64_t vocab, int dim,
                                  typename S::T* out) {
  if (i >= n) return;
  const int64_t token = i / dim;
  const int64_t column = i - token * dim;
  const int64_t id = ids[token];
  out[i] = (id >= 0 && id < vocab) ? table[id * dim + column] : S::Make(NAN);
}

// dtable[rows[u], c] += sum over the tokens of segment u, in token order, of
// dout[token, c]. The segments come from BuildEmbeddingGradIndex (host), so
// each vocabulary row is owned by one thread per column: no atomics, and the
// summation order is the token order.
template <class S>
MT_HD void EmbeddingBackwardThread(int64_t u, int64_t column, const int32_t* unique_rows,
                                   const int32_t* segment_offsets, const int32_t* token_order,
                                   const typename S::T* dout, int dim, float* dtable) {
  if (column >= dim) return;
  float sum = 0.0f;
  for (int32_t k = segment_offsets[u]; k < segment_offsets[u + 1]; ++k) {
    sum += S::Load(dout[static_cast<int64_t>(token_order[k]) * dim + column]);
  }
  dtable[static_cast<int64_t>(unique_rows[u]) * dim + column] += sum;
}

// partials[group, c] = sum over the group's rows r (in order) of dy*x*rstd.
template <class S>
MT_HD void RmsnormDwPartialThread(int64_t group, int64_t column, int64_t rows, int dim,
                                  const typename S::T* x, const typename S::T* dy,
                                  const float* rstd, float* partials) {
  if (column >= dim) return;
  const RowRange range = DwGroupRows(group, rows);
  float sum = 0.0f;
  for (int64_t r = range.begin; r < range.end; ++r) {
    sum +=
        RmsnormBackwardWeight(S::Load(x[r * dim + column]), S::Load(dy[r * dim + column]), rstd[r]);
  }
  partials[group * dim + column] = sum;
}

// dw[c] += sum over groups g = 0, 1, ... of partials[g, c].
MT_HD void RmsnormDwFinalThread(int64_t column, int64_t groups, int dim, const float* partials,
                                float* dw) {
  if (column >= dim) return;
  float sum = 0.0f;
  for (int64_t g = 0; g < groups; ++g) sum += partials[g * dim + column];
  dw[column] += sum;
}

}  // namespace megatrain::kernels::cuda
