// Causal GQA attention with optional sliding window and segment ids, tiled forward and
// FlashAttention-2 backward.
#include "kernels/cpu/attention.h"

#include <cblas.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/common/attention.h"
#include "kernels/common/softmax.h"
#include "kernels/cpu/ordered_sum.h"

namespace megatrain::kernels::cpu {
namespace {

// first_key[i]: the first key query i sees (its segment's start, or the sliding window's first
// key, whichever is later); the last is i itself. Non-decreasing in i, because segments are
// contiguous runs and the window slides forward.
void FirstVisibleKeys(const AttentionShape& s, const int32_t* segments, int64_t* first_key) {
  int64_t segment_start = 0;
  for (int64_t i = 0; i < s.seq; ++i) {
    if (segments != nullptr && i > 0 && segments[i] != segments[i - 1]) segment_start = i;
    const int64_t window_start = s.window == 0 ? 0 : std::max<int64_t>(0, i - s.window + 1);
    first_key[i] = std::max(segment_start, window_start);
  }
}

bool Visible(int64_t i, int64_t j, const int64_t* first_key) { return j <= i && j >= first_key[i]; }

// True when every (i, j) with i in [i0, i1), j in [j0, j1) is visible.
bool TileFullyVisible(int64_t i0, int64_t i1, int64_t j0, int64_t j1, const int64_t* first_key) {
  return j1 - 1 <= i0 && j0 >= first_key[i1 - 1];
}

// Sets scores of invisible (query, key) pairs of a tile to -inf.
void MaskTile(float* scores, int64_t i0, int64_t nq, int64_t j0, int64_t nk,
              const int64_t* first_key) {
  for (int64_t r = 0; r < nq; ++r) {
    float* row = scores + r * nk;
    for (int64_t c = 0; c < nk; ++c) {
      if (!Visible(i0 + r, j0 + c, first_key)) row[c] = -INFINITY;
    }
  }
}

void Gemm(CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int64_t m, int64_t n, int64_t k,
          float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
          float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a, trans_b, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

// Strided views of one (batch, head) pair: rows are tokens.
struct HeadView {
  int64_t q_offset;  // element offset of token 0 of this query head
  int64_t kv_offset;
  int64_t q_stride;  // elements between consecutive tokens
  int64_t kv_stride;
};

HeadView MakeHeadView(const AttentionShape& s, int64_t b, int64_t h) {
  const int64_t group = s.q_heads / s.kv_heads;
  const int64_t g = h / group;
  return HeadView{(b * s.seq * s.q_heads + h) * s.head_dim,
                  (b * s.seq * s.kv_heads + g) * s.head_dim, s.q_heads * s.head_dim,
                  s.kv_heads * s.head_dim};
}

void ForwardOneHead(const AttentionShape& s, const AttentionTiles& tiles, const HeadView& view,
                    const float* q, const float* k, const float* v, float* out, float* lse_row,
                    float* scores, float* run_max, float* run_sum, const int64_t* first_key) {
  const int64_t d = s.head_dim;
  for (int64_t i0 = 0; i0 < s.seq; i0 += tiles.q_tile) {
    const int64_t i1 = std::min(s.seq, i0 + tiles.q_tile);
    const int64_t nq = i1 - i0;
    const float* q_tile = q + view.q_offset + i0 * view.q_stride;
    float* out_tile = out + view.q_offset + i0 * view.q_stride;
    for (int64_t r = 0; r < nq; ++r) {
      std::memset(out_tile + r * view.q_stride, 0, sizeof(float) * d);
      run_max[r] = -INFINITY;
      run_sum[r] = 0.0f;
    }
    // Keys before the tile's first query's first visible key are seen by no query of the tile.
    const int64_t last_key = i1 - 1;
    for (int64_t j0 = (first_key[i0] / tiles.k_tile) * tiles.k_tile; j0 <= last_key;
         j0 += tiles.k_tile) {
      const int64_t j1 = std::min(s.seq, j0 + tiles.k_tile);
      const int64_t nk = j1 - j0;
      const float* k_tile = k + view.kv_offset + j0 * view.kv_stride;
      const float* v_tile = v + view.kv_offset + j0 * view.kv_stride;
      Gemm(CblasNoTrans, CblasTrans, nq, nk, d, s.scale, q_tile, view.q_stride, k_tile,
           view.kv_stride, 0.0f, scores, nk);
      if (!TileFullyVisible(i0, i1, j0, j1, first_key)) {
        MaskTile(scores, i0, nq, j0, nk, first_key);
      }
      for (int64_t r = 0; r < nq; ++r) {
        float* row = scores + r * nk;
        const float new_max = std::max(run_max[r], RowMax(row, nk));
        if (new_max == -INFINITY) {  // nothing visible yet in this row (or in this tile at all)
          std::memset(row, 0, sizeof(float) * nk);
          continue;
        }
        // Exponentiating against the merged max makes the tile's own scale 1.
        const float tile_sum = ExpShiftedInPlaceAndSum(row, nk, new_max);
        OnlineSoftmax state{run_max[r], run_sum[r]};
        const float old_scale = OnlineSoftmaxMerge(&state, new_max, tile_sum);
        run_max[r] = state.max;
        run_sum[r] = state.sum;
        float* out_row = out_tile + r * view.q_stride;
        for (int64_t c = 0; c < d; ++c) out_row[c] *= old_scale;
      }
      Gemm(CblasNoTrans, CblasNoTrans, nq, d, nk, 1.0f, scores, nk, v_tile, view.kv_stride, 1.0f,
           out_tile, view.q_stride);
    }
    for (int64_t r = 0; r < nq; ++r) {
      const float inv_sum = 1.0f / run_sum[r];
      float* out_row = out_tile + r * view.q_stride;
      for (int64_t c = 0; c < d; ++c) out_row[c] *= inv_sum;
      lse_row[i0 + r] = OnlineSoftmaxLogSumExp(OnlineSoftmax{run_max[r], run_sum[r]});
    }
  }
}

void BackwardOneHead(const AttentionShape& s, const AttentionTiles& tiles, const HeadView& view,
                     const float* q, const float* k, const float* v, const float* out,
                     const float* lse_row, const float* dout, float* dq, float* dk, float* dv,
                     float* probs, float* dprobs, float* out_dot_dout, const int64_t* first_key) {
  const int64_t d = s.head_dim;
  for (int64_t i = 0; i < s.seq; ++i) {
    const int64_t offset = view.q_offset + i * view.q_stride;
    out_dot_dout[i] = OrderedDot(out + offset, dout + offset, d);
  }
  for (int64_t j0 = 0; j0 < s.seq; j0 += tiles.k_tile) {
    const int64_t j1 = std::min(s.seq, j0 + tiles.k_tile);
    const int64_t nk = j1 - j0;
    const int64_t kv_offset = view.kv_offset + j0 * view.kv_stride;
    for (int64_t i0 = (j0 / tiles.q_tile) * tiles.q_tile; i0 < s.seq; i0 += tiles.q_tile) {
      // first_key is non-decreasing: once a tile's first query sees none of these keys, no
      // later query does (another segment, or past the window).
      if (first_key[i0] > j1 - 1) break;
      const int64_t i1 = std::min(s.seq, i0 + tiles.q_tile);
      const int64_t nq = i1 - i0;
      const int64_t q_offset = view.q_offset + i0 * view.q_stride;
      Gemm(CblasNoTrans, CblasTrans, nq, nk, d, s.scale, q + q_offset, view.q_stride, k + kv_offset,
           view.kv_stride, 0.0f, probs, nk);
      if (!TileFullyVisible(i0, i1, j0, j1, first_key)) MaskTile(probs, i0, nq, j0, nk, first_key);
      for (int64_t r = 0; r < nq; ++r) {
        float* row = probs + r * nk;
        const float row_lse = lse_row[i0 + r];
        // AttentionProbability (kernels/common/attention.h) with FastExp for expf.
        for (int64_t c = 0; c < nk; ++c) row[c] = FastExp(row[c] - row_lse);
      }
      // dV_j += P^T dO_i
      Gemm(CblasTrans, CblasNoTrans, nk, d, nq, 1.0f, probs, nk, dout + q_offset, view.q_stride,
           1.0f, dv + kv_offset, view.kv_stride);
      // dP = dO_i V_j^T
      Gemm(CblasNoTrans, CblasTrans, nq, nk, d, 1.0f, dout + q_offset, view.q_stride, v + kv_offset,
           view.kv_stride, 0.0f, dprobs, nk);
      // dS = P * (dP - D_i), with the softmax scale folded in for dQ and dK.
      for (int64_t r = 0; r < nq; ++r) {
        const float* p_row = probs + r * nk;
        float* ds_row = dprobs + r * nk;
        const float row_d = out_dot_dout[i0 + r];
        for (int64_t c = 0; c < nk; ++c) {
          ds_row[c] = AttentionScoreGrad(p_row[c], ds_row[c], row_d) * s.scale;
        }
      }
      // dQ_i += dS K_j;  dK_j += dS^T Q_i
      Gemm(CblasNoTrans, CblasNoTrans, nq, d, nk, 1.0f, dprobs, nk, k + kv_offset, view.kv_stride,
           1.0f, dq + q_offset, view.q_stride);
      Gemm(CblasTrans, CblasNoTrans, nk, d, nq, 1.0f, dprobs, nk, q + q_offset, view.q_stride, 1.0f,
           dk + kv_offset, view.kv_stride);
    }
  }
}

}  // namespace

size_t AttentionForwardWorkspaceFloats(const AttentionShape&, const AttentionTiles& tiles) {
  return static_cast<size_t>(tiles.q_tile * tiles.k_tile + 2 * tiles.q_tile);
}

size_t AttentionBackwardWorkspaceFloats(const AttentionShape& shape, const AttentionTiles& tiles) {
  return static_cast<size_t>(2 * tiles.q_tile * tiles.k_tile + shape.seq);
}

void AttentionForward(const AttentionShape& shape, const AttentionTiles& tiles, const float* q,
                      const float* k, const float* v, float* out, float* lse, float* workspace,
                      const int32_t* segments) {
  assert(shape.kv_heads > 0 && shape.q_heads % shape.kv_heads == 0);
  assert(tiles.q_tile > 0 && tiles.k_tile > 0 && shape.window >= 0);
  std::vector<float> owned;
  if (workspace == nullptr) {
    owned.resize(AttentionForwardWorkspaceFloats(shape, tiles));
    workspace = owned.data();
  }
  float* scores = workspace;
  float* run_max = scores + tiles.q_tile * tiles.k_tile;
  float* run_sum = run_max + tiles.q_tile;
  std::vector<int64_t> first_key(static_cast<size_t>(shape.seq));
  for (int64_t b = 0; b < shape.batch; ++b) {
    FirstVisibleKeys(shape, segments == nullptr ? nullptr : segments + b * shape.seq,
                     first_key.data());
    for (int64_t h = 0; h < shape.q_heads; ++h) {
      float* lse_row = lse + (b * shape.q_heads + h) * shape.seq;
      ForwardOneHead(shape, tiles, MakeHeadView(shape, b, h), q, k, v, out, lse_row, scores,
                     run_max, run_sum, first_key.data());
    }
  }
}

void AttentionBackward(const AttentionShape& shape, const AttentionTiles& tiles, const float* q,
                       const float* k, const float* v, const float* out, const float* lse,
                       const float* dout, float* dq, float* dk, float* dv, float* workspace,
                       const int32_t* segments) {
  assert(shape.kv_heads > 0 && shape.q_heads % shape.kv_heads == 0);
  assert(tiles.q_tile > 0 && tiles.k_tile > 0 && shape.window >= 0);
  std::vector<float> owned;
  if (workspace == nullptr) {
    owned.resize(AttentionBackwardWorkspaceFloats(shape, tiles));
    workspace = owned.data();
  }
  float* probs = workspace;
  float* dprobs = probs + tiles.q_tile * tiles.k_tile;
  float* out_dot_dout = dprobs + tiles.q_tile * tiles.k_tile;
  const size_t q_bytes = sizeof(float) * shape.batch * shape.seq * shape.q_heads * shape.head_dim;
  const size_t kv_bytes = sizeof(float) * shape.batch * shape.seq * shape.kv_heads * shape.head_dim;
  std::memset(dq, 0, q_bytes);
  std::memset(dk, 0, kv_bytes);
  std::memset(dv, 0, kv_bytes);
  std::vector<int64_t> first_key(static_cast<size_t>(shape.seq));
  for (int64_t b = 0; b < shape.batch; ++b) {
    FirstVisibleKeys(shape, segments == nullptr ? nullptr : segments + b * shape.seq,
                     first_key.data());
    for (int64_t h = 0; h < shape.q_heads; ++h) {
      const float* lse_row = lse + (b * shape.q_heads + h) * shape.seq;
      BackwardOneHead(shape, tiles, MakeHeadView(shape, b, h), q, k, v, out, lse_row, dout, dq, dk,
                      dv, probs, dprobs, out_dot_dout, first_key.data());
    }
  }
}

}  // namespace megatrain::kernels::cpu
