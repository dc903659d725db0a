// Per-block bodies of the CUDA attention kernels (forward, delta, dK/dV, dQ), their shared-memory
// tiles and their launch shapes, templated on the storage policy S (see thread_bodies.h) and
// head_dim D: attention.cu runs them on bf16, attention_bodies_test under the host block emulator
// (device_shim.h maps the CUDA builtins to it), over the same AttentionLaunchOf shapes.
//
// FlashAttention-2 style, fp32 math on CUDA cores: forward with online softmax saving lse;
// backward as three deterministic kernels (delta = rowsum(dO * O); dK/dV with one block owning a
// key tile across all its query heads; dQ with one block owning a query tile) so no gradient is
// ever accumulated with atomics.
//
// Layouts: q, out, dq [batch, seq, q_heads, D]; k, v, dk, dv [batch, seq, kv_heads, D]; lse,
// delta [batch, q_heads, seq] fp32. Query head h reads kv head h / (q_heads / kv_heads).
// softmax_scale is folded into q on load, so every kernel computes the same score bits:
// S = sum_d (q_d * scale) * k_d, summed per lane over its interleaved dims, then across the
// row's lanes.
//
// Segment ids (packed samples, optional): segments [batch, seq], non-decreasing along each
// sequence; a key is visible to a query only in the same segment. Blocks start their key loop
// at the tile of their first row's segment start (and the dK/dV blocks end their query loop at
// their last key's segment end), so tiles that only hold other samples are never computed.
// Without segments every rule reduces to the plain causal one, bit for bit.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/common/attention.h"
#include "kernels/common/softmax.h"
#include "kernels/cuda/block_reduce.h"
#include "kernels/cuda/device_shim.h"
#include "kernels/cuda/launch_geometry.h"

namespace megatrain::kernels::cuda {

// What every attention body reads besides its tensors (the kernels' by-value argument).
struct AttentionKernelDims {
  int batch, seq, q_heads, kv_heads;
  float scale;
  const int32_t* segments;  // [batch, seq] or null
};

// Shared memory of the forward and dQ blocks: one tile of keys and values (float) and their
// segment ids. The kernels declare the three arrays __shared__ themselves (separate arrays: ptxas
// allocates fewer registers than for one struct); the emulator test carves them, in the same
// order, out of Bytes() of emulated shared memory.
template <int D>
struct AttentionKeyTiles {
  float (*k)[D];
  float (*v)[D];
  int32_t* segments;

  static constexpr size_t Bytes() {
    return 2 * sizeof(float[kAttnTile][D]) + sizeof(int32_t[kAttnTile]);
  }
  static AttentionKeyTiles Carve(void* shared) {
    float(*const k)[D] = static_cast<float(*)[D]>(shared);
    return AttentionKeyTiles{k, k + kAttnTile, reinterpret_cast<int32_t*>(k + 2 * kAttnTile)};
  }
};

// Shared memory of the dK/dV blocks: one tile of queries (times scale) and output gradients,
// their lse, delta and segment ids (declared and carved like AttentionKeyTiles).
template <int D>
struct AttentionQueryTiles {
  float (*q)[D];
  float (*dout)[D];
  float* lse;
  float* delta;
  int32_t* segments;

  static constexpr size_t Bytes() {
    return 2 * sizeof(float[kAttnTile][D]) + 2 * sizeof(float[kAttnTile]) +
           sizeof(int32_t[kAttnTile]);
  }
  static AttentionQueryTiles Carve(void* shared) {
    float(*const q)[D] = static_cast<float(*)[D]>(shared);
    float* const lse = reinterpret_cast<float*>(q + 2 * kAttnTile);
    return AttentionQueryTiles{q, q + kAttnTile, lse, lse + kAttnTile,
                               reinterpret_cast<int32_t*>(lse + 2 * kAttnTile)};
  }
};

// The most shared memory a block may declare statically (and use dynamically without
// cudaFuncAttributeMaxDynamicSharedMemorySize).
inline constexpr size_t kMaxStaticSharedBytes = 48 * 1024;

enum class AttentionPass { kForward, kDelta, kDkDv, kDq };

// One attention launch: its grid and block (kAttnThreads), and the shared memory its kernel
// declares (static: the launch itself asks for no dynamic shared memory).
struct AttentionLaunch {
  LaunchShape shape;
  size_t shared_bytes = 0;
};

// The launch of `pass`: forward, delta and dQ over (query tiles, batch * q_heads); dK/dV over
// (key tiles, batch * kv_heads).
template <int D>
AttentionLaunch AttentionLaunchOf(AttentionPass pass, const AttentionKernelDims& dims) {
  static_assert(D % kAttnThreadsPerRow == 0, "each lane owns D / kAttnThreadsPerRow dims");
  // ptxas rejects more static shared memory; past it the tiles would have to become dynamic
  // shared memory with the kernels' cudaFuncAttributeMaxDynamicSharedMemorySize raised.
  static_assert(AttentionKeyTiles<D>::Bytes() <= kMaxStaticSharedBytes &&
                    AttentionQueryTiles<D>::Bytes() <= kMaxStaticSharedBytes,
                "attention tiles of this head_dim exceed 48 KiB of shared memory");
  switch (pass) {
    case AttentionPass::kForward:
    case AttentionPass::kDq:
      return AttentionLaunch{AttentionGrid(dims.seq, dims.batch, dims.q_heads),
                             AttentionKeyTiles<D>::Bytes()};
    case AttentionPass::kDelta:
      return AttentionLaunch{AttentionGrid(dims.seq, dims.batch, dims.q_heads), 0};
    case AttentionPass::kDkDv:
      return AttentionLaunch{AttentionGrid(dims.seq, dims.batch, dims.kv_heads),
                             AttentionQueryTiles<D>::Bytes()};
  }
  return AttentionLaunch{};
}

namespace attention_internal {

inline constexpr int kLanes = kAttnThreadsPerRow;
inline constexpr int kRows = kAttnRowsPerBlock;
inline constexpr int kTile = kAttnTile;

MT_DEVICE int MinInt(int a, int b) { return b < a ? b : a; }

// The segment id of token `index` of sequence b (0 without segment ids).
MT_DEVICE int32_t SegmentOf(const AttentionKernelDims& dims, int b, int index) {
  return dims.segments == nullptr ? 0 : dims.segments[static_cast<int64_t>(b) * dims.seq + index];
}

// The first token of the segment holding token `row` (ids are non-decreasing: binary search).
MT_DEVICE_FN int SegmentStart(const AttentionKernelDims& dims, int b, int row) {
  if (dims.segments == nullptr) return 0;
  const int32_t id = SegmentOf(dims, b, row);
  int lo = 0, hi = row;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (SegmentOf(dims, b, mid) < id) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// One past the last token of the segment holding token `row`.
MT_DEVICE_FN int SegmentEnd(const AttentionKernelDims& dims, int b, int row) {
  if (dims.segments == nullptr) return dims.seq;
  const int32_t id = SegmentOf(dims, b, row);
  int lo = row + 1, hi = dims.seq;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (SegmentOf(dims, b, mid) <= id) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Segment ids of rows [first, first + kTile) of sequence b into smem (-1 past the end).
MT_DEVICE_FN void LoadSegmentTile(const AttentionKernelDims& dims, int b, int first,
                                  int32_t* tile) {
  for (int t = MT_THREAD_X(); t < kTile; t += kAttnThreads) {
    tile[t] = first + t < dims.seq ? SegmentOf(dims, b, first + t) : -1;
  }
}

// Copies rows [first, first + kTile) of head `head` of a [batch, seq, heads, D] tensor into smem
// as float (times `multiplier`), zero-filling rows past the sequence end.
template <class S, int D>
MT_DEVICE_FN void LoadTile(const typename S::T* src, int b, int first, int head, int heads, int seq,
                           float multiplier, float (*tile)[D]) {
  for (int e = MT_THREAD_X(); e < kTile * D; e += kAttnThreads) {
    const int row = e / D;
    const int d = e - row * D;
    const int s = first + row;
    tile[row][d] =
        s < seq ? S::Load(src[BshdOffset(b, s, head, seq, heads, D) + d]) * multiplier : 0.0f;
  }
}

// Loads this thread's interleaved slice (dims lane, lane + kLanes, ...) of one row, or zeros for
// rows past the end.
template <class S, int D>
MT_DEVICE_FN void LoadSlice(const typename S::T* row_ptr, bool active, int lane, float multiplier,
                            float (&slice)[D / kLanes]) {
  MT_UNROLL
  for (int e = 0; e < D / kLanes; ++e) {
    slice[e] = active ? S::Load(row_ptr[lane + kLanes * e]) * multiplier : 0.0f;
  }
}

// The dot product of a row held as slices by its kLanes lanes with a row in smem; every lane of
// the row gets the same bits.
template <int D>
MT_DEVICE float RowDot(const float (&slice)[D / kLanes], const float* row, int lane) {
  float partial = 0.0f;
  MT_UNROLL
  for (int e = 0; e < D / kLanes; ++e) partial += slice[e] * row[lane + kLanes * e];
  return LaneGroupSum<kLanes>(partial);
}

}  // namespace attention_internal

// Block (query tile, b * q_heads + h): out and lse of its rows, over the key tiles from its first
// row's segment start to its causal end.
template <class S, int D>
MT_DEVICE void AttentionForwardBlock(AttentionKernelDims dims, const typename S::T* q,
                                     const typename S::T* k, const typename S::T* v,
                                     typename S::T* out, float* lse, AttentionKeyTiles<D> tiles) {
  using namespace attention_internal;
  const int b = MT_BLOCK_Y() / dims.q_heads;
  const int h = MT_BLOCK_Y() - b * dims.q_heads;
  const int kv_head = h / (dims.q_heads / dims.kv_heads);
  const AttnRowSlot slot = AttentionRowSlot(MT_BLOCK_X(), MT_THREAD_X());
  const bool active = slot.row < dims.seq;
  const int64_t q_offset = BshdOffset(b, active ? slot.row : 0, h, dims.seq, dims.q_heads, D);
  const int32_t row_segment = active ? SegmentOf(dims, b, slot.row) : -2;

  float q_slice[D / kLanes];
  float o[D / kLanes];
  LoadSlice<S, D>(q + q_offset, active, slot.lane, dims.scale, q_slice);
  MT_UNROLL
  for (int e = 0; e < D / kLanes; ++e) o[e] = 0.0f;
  OnlineSoftmax state;

  const int first_row = MT_BLOCK_X() * kRows;
  const int key_end = CausalKeyEnd(first_row, kRows, dims.seq);
  const int key_begin = SegmentStart(dims, b, MinInt(first_row, dims.seq - 1)) / kTile * kTile;
  for (int k0 = key_begin; k0 < key_end; k0 += kTile) {
    MT_SYNC_THREADS();  // previous tile fully consumed
    LoadTile<S, D>(k, b, k0, kv_head, dims.kv_heads, dims.seq, 1.0f, tiles.k);
    LoadTile<S, D>(v, b, k0, kv_head, dims.kv_heads, dims.seq, 1.0f, tiles.v);
    LoadSegmentTile(dims, b, k0, tiles.segments);
    MT_SYNC_THREADS();
    float p[kTile];
    float tile_max = -INFINITY;
    MT_UNROLL
    for (int j = 0; j < kTile; ++j) {
      const float score = RowDot<D>(q_slice, tiles.k[j], slot.lane);
      // Also excludes keys >= seq (their segment is -1) and other samples' keys.
      const bool visible = active && k0 + j <= slot.row && tiles.segments[j] == row_segment;
      p[j] = visible ? score : -INFINITY;
      tile_max = fmaxf(tile_max, p[j]);
    }
    // Exponentiate against the merged max, so the tile enters the merge with scale 1 and only
    // the accumulator needs rescaling.
    const float new_max = fmaxf(state.max, tile_max);
    // Nothing visible to this row yet (its sample starts in a later tile): nothing to merge.
    if (new_max == -INFINITY) continue;
    float tile_sum = 0.0f;
    MT_UNROLL
    for (int j = 0; j < kTile; ++j) {
      p[j] = p[j] == -INFINITY ? 0.0f : expf(p[j] - new_max);
      tile_sum += p[j];
    }
    const float old_scale = OnlineSoftmaxMerge(&state, new_max, tile_sum);
    MT_UNROLL
    for (int e = 0; e < D / kLanes; ++e) {
      float acc = o[e] * old_scale;
      for (int j = 0; j < kTile; ++j) acc += p[j] * tiles.v[j][slot.lane + kLanes * e];
      o[e] = acc;
    }
  }
  if (!active) return;
  const float inv_sum = 1.0f / state.sum;  // > 0: every row sees itself
  MT_UNROLL
  for (int e = 0; e < D / kLanes; ++e) {
    out[q_offset + slot.lane + kLanes * e] = S::Make(o[e] * inv_sum);
  }
  if (slot.lane == 0) {
    lse[(static_cast<int64_t>(b) * dims.q_heads + h) * dims.seq + slot.row] =
        OnlineSoftmaxLogSumExp(state);
  }
}

// Block (query tile, b * q_heads + h): delta[b, h, s] = sum_d dO * O (O as stored).
template <class S, int D>
MT_DEVICE void AttentionDeltaBlock(AttentionKernelDims dims, const typename S::T* out,
                                   const typename S::T* dout, float* delta) {
  using namespace attention_internal;
  const int b = MT_BLOCK_Y() / dims.q_heads;
  const int h = MT_BLOCK_Y() - b * dims.q_heads;
  const AttnRowSlot slot = AttentionRowSlot(MT_BLOCK_X(), MT_THREAD_X());
  const bool active = slot.row < dims.seq;
  const int64_t offset = BshdOffset(b, active ? slot.row : 0, h, dims.seq, dims.q_heads, D);
  float partial = 0.0f;
  if (active) {
    MT_UNROLL
    for (int e = 0; e < D / kLanes; ++e) {
      const int64_t i = offset + slot.lane + kLanes * e;
      partial += S::Load(dout[i]) * S::Load(out[i]);
    }
  }
  const float total = LaneGroupSum<kLanes>(partial);
  if (active && slot.lane == 0) {
    delta[(static_cast<int64_t>(b) * dims.q_heads + h) * dims.seq + slot.row] = total;
  }
}

// Block (key tile, b * kv_heads + kv_head): dK, dV of its keys summed over the group's query
// heads in order and over the query rows in order.
template <class S, int D>
MT_DEVICE void AttentionDkDvBlock(AttentionKernelDims dims, const typename S::T* q,
                                  const typename S::T* k, const typename S::T* v,
                                  const typename S::T* dout, const float* lse, const float* delta,
                                  typename S::T* dk, typename S::T* dv,
                                  AttentionQueryTiles<D> tiles) {
  using namespace attention_internal;
  const int b = MT_BLOCK_Y() / dims.kv_heads;
  const int kv_head = MT_BLOCK_Y() - b * dims.kv_heads;
  const int group = dims.q_heads / dims.kv_heads;
  const AttnRowSlot slot = AttentionRowSlot(MT_BLOCK_X(), MT_THREAD_X());
  const bool active = slot.row < dims.seq;  // slot.row is a key index here
  const int64_t kv_offset =
      BshdOffset(b, active ? slot.row : 0, kv_head, dims.seq, dims.kv_heads, D);

  float k_slice[D / kLanes];
  float v_slice[D / kLanes];
  float dk_acc[D / kLanes];
  float dv_acc[D / kLanes];
  LoadSlice<S, D>(k + kv_offset, active, slot.lane, 1.0f, k_slice);
  LoadSlice<S, D>(v + kv_offset, active, slot.lane, 1.0f, v_slice);
  MT_UNROLL
  for (int e = 0; e < D / kLanes; ++e) dk_acc[e] = dv_acc[e] = 0.0f;

  const int first_key = MT_BLOCK_X() * kRows;
  const int32_t key_segment = active ? SegmentOf(dims, b, slot.row) : -2;
  // Queries past the segment of the block's last key see none of its keys.
  const int query_end = SegmentEnd(dims, b, MinInt(first_key + kRows, dims.seq) - 1);
  for (int g = 0; g < group; ++g) {
    const int h = kv_head * group + g;
    const int64_t stats_row = (static_cast<int64_t>(b) * dims.q_heads + h) * dims.seq;
    // Causal: only queries >= first_key see any key of this block.
    for (int q0 = first_key; q0 < query_end; q0 += kTile) {
      MT_SYNC_THREADS();
      LoadTile<S, D>(q, b, q0, h, dims.q_heads, dims.seq, dims.scale, tiles.q);
      LoadTile<S, D>(dout, b, q0, h, dims.q_heads, dims.seq, 1.0f, tiles.dout);
      LoadSegmentTile(dims, b, q0, tiles.segments);
      for (int t = MT_THREAD_X(); t < kTile; t += kAttnThreads) {
        const bool in_seq = q0 + t < dims.seq;
        tiles.lse[t] = in_seq ? lse[stats_row + q0 + t] : 0.0f;
        tiles.delta[t] = in_seq ? delta[stats_row + q0 + t] : 0.0f;
      }
      MT_SYNC_THREADS();
      for (int t = 0; t < kTile; ++t) {
        const int query = q0 + t;
        const float score = RowDot<D>(k_slice, tiles.q[t], slot.lane);
        const float d_prob = RowDot<D>(v_slice, tiles.dout[t], slot.lane);
        const bool visible =
            active && query < dims.seq && query >= slot.row && tiles.segments[t] == key_segment;
        const float prob = visible ? AttentionProbability(score, tiles.lse[t]) : 0.0f;
        const float d_score = AttentionScoreGrad(prob, d_prob, tiles.delta[t]);
        MT_UNROLL
        for (int e = 0; e < D / kLanes; ++e) {
          dv_acc[e] += prob * tiles.dout[t][slot.lane + kLanes * e];
          dk_acc[e] += d_score * tiles.q[t][slot.lane + kLanes * e];  // tiles.q holds q * scale
        }
      }
    }
  }
  if (!active) return;
  MT_UNROLL
  for (int e = 0; e < D / kLanes; ++e) {
    dk[kv_offset + slot.lane + kLanes * e] = S::Make(dk_acc[e]);
    dv[kv_offset + slot.lane + kLanes * e] = S::Make(dv_acc[e]);
  }
}

// Block (query tile, b * q_heads + h): dQ = scale * sum_j dS_ij k_j.
template <class S, int D>
MT_DEVICE void AttentionDqBlock(AttentionKernelDims dims, const typename S::T* q,
                                const typename S::T* k, const typename S::T* v,
                                const typename S::T* dout, const float* lse, const float* delta,
                                typename S::T* dq, AttentionKeyTiles<D> tiles) {
  using namespace attention_internal;
  const int b = MT_BLOCK_Y() / dims.q_heads;
  const int h = MT_BLOCK_Y() - b * dims.q_heads;
  const int kv_head = h / (dims.q_heads / dims.kv_heads);
  const AttnRowSlot slot = AttentionRowSlot(MT_BLOCK_X(), MT_THREAD_X());
  const bool active = slot.row < dims.seq;
  const int64_t q_offset = BshdOffset(b, active ? slot.row : 0, h, dims.seq, dims.q_heads, D);
  const int32_t row_segment = active ? SegmentOf(dims, b, slot.row) : -2;
  const int64_t stats = (static_cast<int64_t>(b) * dims.q_heads + h) * dims.seq + slot.row;

  float q_slice[D / kLanes];
  float do_slice[D / kLanes];
  float dq_acc[D / kLanes];
  LoadSlice<S, D>(q + q_offset, active, slot.lane, dims.scale, q_slice);
  LoadSlice<S, D>(dout + q_offset, active, slot.lane, 1.0f, do_slice);
  MT_UNROLL
  for (int e = 0; e < D / kLanes; ++e) dq_acc[e] = 0.0f;
  const float row_lse = active ? lse[stats] : 0.0f;
  const float row_delta = active ? delta[stats] : 0.0f;

  const int first_row = MT_BLOCK_X() * kRows;
  const int key_end = CausalKeyEnd(first_row, kRows, dims.seq);
  const int key_begin = SegmentStart(dims, b, MinInt(first_row, dims.seq - 1)) / kTile * kTile;
  for (int k0 = key_begin; k0 < key_end; k0 += kTile) {
    MT_SYNC_THREADS();
    LoadTile<S, D>(k, b, k0, kv_head, dims.kv_heads, dims.seq, 1.0f, tiles.k);
    LoadTile<S, D>(v, b, k0, kv_head, dims.kv_heads, dims.seq, 1.0f, tiles.v);
    LoadSegmentTile(dims, b, k0, tiles.segments);
    MT_SYNC_THREADS();
    for (int j = 0; j < kTile; ++j) {
      const float score = RowDot<D>(q_slice, tiles.k[j], slot.lane);
      const float d_prob = RowDot<D>(do_slice, tiles.v[j], slot.lane);
      const bool visible = active && k0 + j <= slot.row && tiles.segments[j] == row_segment;
      const float prob = visible ? AttentionProbability(score, row_lse) : 0.0f;
      const float d_score = AttentionScoreGrad(prob, d_prob, row_delta);
      MT_UNROLL
      for (int e = 0; e < D / kLanes; ++e)
        dq_acc[e] += d_score * tiles.k[j][slot.lane + kLanes * e];
    }
  }
  if (!active) return;
  MT_UNROLL
  for (int e = 0; e < D / kLanes; ++e) {
    dq[q_offset + slot.lane + kLanes * e] = S::Make(dq_acc[e] * dims.scale);
  }
}

}  // namespace megatrain::kernels::cuda
