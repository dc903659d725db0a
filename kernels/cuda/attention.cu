// CUDA causal GQA attention, FlashAttention-2 style (our own kernels, fp32
// math on CUDA cores, correctness first): forward with online softmax saving
// lse; backward as three deterministic kernels (delta = rowsum(dO * O); dK/dV
// with one block owning a key tile across all its query heads; dQ with one
// block owning a query tile) so no gradient is ever accumulated with atomics.
//
// Layouts: q, out, dq [batch, seq, q_heads, D]; k, v, dk, dv [batch, seq,
// kv_heads, D]; lse, delta [batch, q_heads, seq] fp32. Query head h reads kv
// head h / (q_heads / kv_heads). softmax_scale is folded into q on load, so
// every kernel computes the same score bits: S = sum_d (q_d * scale) * k_d,
// summed per lane over its interleaved dims, then across the row's lanes.
//
// Segment ids (packed samples, optional): segments [batch, seq], non-decreasing along each
// sequence; a key is visible to a query only in the same segment. Blocks start their key loop
// at the tile of their first row's segment start (and the dK/dV blocks end their query loop at
// their last key's segment end), so tiles that only hold other samples are never computed.
// Without segments every rule reduces to the plain causal one, bit for bit.
#include <cmath>

#include "kernels/common/attention.h"
#include "kernels/common/softmax.h"
#include "kernels/cuda/bf16_storage.cuh"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launch_geometry.h"
#include "kernels/cuda/launchers.h"

namespace megatrain::kernels::cuda {
namespace {

using S = Bf16Storage;
using bf16 = __nv_bfloat16;

constexpr int kLanes = kAttnThreadsPerRow;
constexpr int kRows = kAttnRowsPerBlock;
constexpr int kTile = kAttnTile;

struct Dims {
  int batch, seq, q_heads, kv_heads;
  float scale;
  const int32_t* segments;  // [batch, seq] or null
};

// The segment id of token `index` of sequence b (0 without segment ids).
__device__ __forceinline__ int32_t SegmentOf(const Dims& dims, int b, int index) {
  return dims.segments == nullptr ? 0 : dims.segments[static_cast<int64_t>(b) * dims.seq + index];
}

// The first token of the segment holding token `row` (ids are non-decreasing: binary search).
__device__ int SegmentStart(const Dims& dims, int b, int row) {
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
__device__ int SegmentEnd(const Dims& dims, int b, int row) {
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
__device__ void LoadSegmentTile(const Dims& dims, int b, int first, int32_t* tile) {
  for (int t = threadIdx.x; t < kTile; t += kAttnThreads) {
    tile[t] = first + t < dims.seq ? SegmentOf(dims, b, first + t) : -1;
  }
}

// Copies rows [first, first + kTile) of head `head` of a [batch, seq, heads,
// D] tensor into smem as float (times `multiplier`), zero-filling rows past
// the sequence end.
template <int D>
__device__ void LoadTile(const bf16* src, int b, int first, int head, int heads, int seq,
                         float multiplier, float (*tile)[D]) {
  for (int e = threadIdx.x; e < kTile * D; e += kAttnThreads) {
    const int row = e / D;
    const int d = e - row * D;
    const int s = first + row;
    tile[row][d] =
        s < seq ? S::Load(src[BshdOffset(b, s, head, seq, heads, D) + d]) * multiplier : 0.0f;
  }
}

// Loads this thread's interleaved slice (dims lane, lane + kLanes, ...) of
// one row, or zeros for rows past the end.
template <int D>
__device__ void LoadSlice(const bf16* row_ptr, bool active, int lane, float multiplier,
                          float (&slice)[D / kLanes]) {
#pragma unroll
  for (int e = 0; e < D / kLanes; ++e) {
    slice[e] = active ? S::Load(row_ptr[lane + kLanes * e]) * multiplier : 0.0f;
  }
}

template <int D>
__device__ __forceinline__ float RowDot(const float (&slice)[D / kLanes], const float* row,
                                        int lane) {
  float partial = 0.0f;
#pragma unroll
  for (int e = 0; e < D / kLanes; ++e) partial += slice[e] * row[lane + kLanes * e];
  return LaneGroupSum<kLanes>(partial);
}

template <int D>
__global__ void __launch_bounds__(kAttnThreads)
    AttentionForwardKernel(Dims dims, const bf16* q, const bf16* k, const bf16* v, bf16* out,
                           float* lse) {
  __shared__ float k_tile[kTile][D];
  __shared__ float v_tile[kTile][D];
  __shared__ int32_t key_segments[kTile];
  const int b = blockIdx.y / dims.q_heads;
  const int h = blockIdx.y - b * dims.q_heads;
  const int kv_head = h / (dims.q_heads / dims.kv_heads);
  const AttnRowSlot slot = AttentionRowSlot(blockIdx.x, threadIdx.x);
  const bool active = slot.row < dims.seq;
  const int64_t q_offset = BshdOffset(b, active ? slot.row : 0, h, dims.seq, dims.q_heads, D);
  const int32_t row_segment = active ? SegmentOf(dims, b, slot.row) : -2;

  float q_slice[D / kLanes];
  float o[D / kLanes];
  LoadSlice<D>(q + q_offset, active, slot.lane, dims.scale, q_slice);
#pragma unroll
  for (int e = 0; e < D / kLanes; ++e) o[e] = 0.0f;
  OnlineSoftmax state;

  const int first_row = blockIdx.x * kRows;
  const int key_end = CausalKeyEnd(first_row, kRows, dims.seq);
  const int key_begin = SegmentStart(dims, b, min(first_row, dims.seq - 1)) / kTile * kTile;
  for (int k0 = key_begin; k0 < key_end; k0 += kTile) {
    __syncthreads();  // previous tile fully consumed
    LoadTile<D>(k, b, k0, kv_head, dims.kv_heads, dims.seq, 1.0f, k_tile);
    LoadTile<D>(v, b, k0, kv_head, dims.kv_heads, dims.seq, 1.0f, v_tile);
    LoadSegmentTile(dims, b, k0, key_segments);
    __syncthreads();
    float p[kTile];
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kTile; ++j) {
      const float score = RowDot<D>(q_slice, k_tile[j], slot.lane);
      // Also excludes keys >= seq (their segment is -1) and other samples' keys.
      const bool visible = active && k0 + j <= slot.row && key_segments[j] == row_segment;
      p[j] = visible ? score : -INFINITY;
      tile_max = fmaxf(tile_max, p[j]);
    }
    // Exponentiate against the merged max, so the tile enters the merge with
    // scale 1 and only the accumulator needs rescaling.
    const float new_max = fmaxf(state.max, tile_max);
    // Nothing visible to this row yet (its sample starts in a later tile): nothing to merge.
    if (new_max == -INFINITY) continue;
    float tile_sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kTile; ++j) {
      p[j] = p[j] == -INFINITY ? 0.0f : expf(p[j] - new_max);
      tile_sum += p[j];
    }
    const float old_scale = OnlineSoftmaxMerge(&state, new_max, tile_sum);
#pragma unroll
    for (int e = 0; e < D / kLanes; ++e) {
      float acc = o[e] * old_scale;
      for (int j = 0; j < kTile; ++j) acc += p[j] * v_tile[j][slot.lane + kLanes * e];
      o[e] = acc;
    }
  }
  if (!active) return;
  const float inv_sum = 1.0f / state.sum;  // > 0: every row sees itself
#pragma unroll
  for (int e = 0; e < D / kLanes; ++e) {
    out[q_offset + slot.lane + kLanes * e] = S::Make(o[e] * inv_sum);
  }
  if (slot.lane == 0) {
    lse[(static_cast<int64_t>(b) * dims.q_heads + h) * dims.seq + slot.row] =
        OnlineSoftmaxLogSumExp(state);
  }
}

// delta[b, h, s] = sum_d dO * O (O as stored, bf16).
template <int D>
__global__ void __launch_bounds__(kAttnThreads)
    AttentionDeltaKernel(Dims dims, const bf16* out, const bf16* dout, float* delta) {
  const int b = blockIdx.y / dims.q_heads;
  const int h = blockIdx.y - b * dims.q_heads;
  const AttnRowSlot slot = AttentionRowSlot(blockIdx.x, threadIdx.x);
  const bool active = slot.row < dims.seq;
  const int64_t offset = BshdOffset(b, active ? slot.row : 0, h, dims.seq, dims.q_heads, D);
  float partial = 0.0f;
  if (active) {
#pragma unroll
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

// One block per (key tile, batch * kv_head): dK, dV of its keys summed over
// the group's query heads in order and over the query rows in order.
template <int D>
__global__ void __launch_bounds__(kAttnThreads)
    AttentionDkDvKernel(Dims dims, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                        const float* lse, const float* delta, bf16* dk, bf16* dv) {
  __shared__ float q_tile[kTile][D];
  __shared__ float do_tile[kTile][D];
  __shared__ float lse_tile[kTile];
  __shared__ float delta_tile[kTile];
  __shared__ int32_t query_segments[kTile];
  const int b = blockIdx.y / dims.kv_heads;
  const int kv_head = blockIdx.y - b * dims.kv_heads;
  const int group = dims.q_heads / dims.kv_heads;
  const AttnRowSlot slot = AttentionRowSlot(blockIdx.x, threadIdx.x);
  const bool active = slot.row < dims.seq;  // slot.row is a key index here
  const int64_t kv_offset =
      BshdOffset(b, active ? slot.row : 0, kv_head, dims.seq, dims.kv_heads, D);

  float k_slice[D / kLanes];
  float v_slice[D / kLanes];
  float dk_acc[D / kLanes];
  float dv_acc[D / kLanes];
  LoadSlice<D>(k + kv_offset, active, slot.lane, 1.0f, k_slice);
  LoadSlice<D>(v + kv_offset, active, slot.lane, 1.0f, v_slice);
#pragma unroll
  for (int e = 0; e < D / kLanes; ++e) dk_acc[e] = dv_acc[e] = 0.0f;

  const int first_key = blockIdx.x * kRows;
  const int32_t key_segment = active ? SegmentOf(dims, b, slot.row) : -2;
  // Queries past the segment of the block's last key see none of its keys.
  const int query_end = SegmentEnd(dims, b, min(first_key + kRows, dims.seq) - 1);
  for (int g = 0; g < group; ++g) {
    const int h = kv_head * group + g;
    const int64_t stats_row = (static_cast<int64_t>(b) * dims.q_heads + h) * dims.seq;
    // Causal: only queries >= first_key see any key of this block.
    for (int q0 = first_key; q0 < query_end; q0 += kTile) {
      __syncthreads();
      LoadTile<D>(q, b, q0, h, dims.q_heads, dims.seq, dims.scale, q_tile);
      LoadTile<D>(dout, b, q0, h, dims.q_heads, dims.seq, 1.0f, do_tile);
      LoadSegmentTile(dims, b, q0, query_segments);
      for (int t = threadIdx.x; t < kTile; t += kAttnThreads) {
        const bool in_seq = q0 + t < dims.seq;
        lse_tile[t] = in_seq ? lse[stats_row + q0 + t] : 0.0f;
        delta_tile[t] = in_seq ? delta[stats_row + q0 + t] : 0.0f;
      }
      __syncthreads();
      for (int t = 0; t < kTile; ++t) {
        const int query = q0 + t;
        const float score = RowDot<D>(k_slice, q_tile[t], slot.lane);
        const float d_prob = RowDot<D>(v_slice, do_tile[t], slot.lane);
        const bool visible = active && query < dims.seq && query >= slot.row &&
                             query_segments[t] == key_segment;
        const float prob = visible ? AttentionProbability(score, lse_tile[t]) : 0.0f;
        const float d_score = AttentionScoreGrad(prob, d_prob, delta_tile[t]);
#pragma unroll
        for (int e = 0; e < D / kLanes; ++e) {
          dv_acc[e] += prob * do_tile[t][slot.lane + kLanes * e];
          dk_acc[e] += d_score * q_tile[t][slot.lane + kLanes * e];  // q_tile holds q * scale
        }
      }
    }
  }
  if (!active) return;
#pragma unroll
  for (int e = 0; e < D / kLanes; ++e) {
    dk[kv_offset + slot.lane + kLanes * e] = S::Make(dk_acc[e]);
    dv[kv_offset + slot.lane + kLanes * e] = S::Make(dv_acc[e]);
  }
}

// One block per (query tile, batch * q_head): dQ = scale * sum_j dS_ij k_j.
template <int D>
__global__ void __launch_bounds__(kAttnThreads)
    AttentionDqKernel(Dims dims, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                      const float* lse, const float* delta, bf16* dq) {
  __shared__ float k_tile[kTile][D];
  __shared__ float v_tile[kTile][D];
  __shared__ int32_t key_segments[kTile];
  const int b = blockIdx.y / dims.q_heads;
  const int h = blockIdx.y - b * dims.q_heads;
  const int kv_head = h / (dims.q_heads / dims.kv_heads);
  const AttnRowSlot slot = AttentionRowSlot(blockIdx.x, threadIdx.x);
  const bool active = slot.row < dims.seq;
  const int64_t q_offset = BshdOffset(b, active ? slot.row : 0, h, dims.seq, dims.q_heads, D);
  const int32_t row_segment = active ? SegmentOf(dims, b, slot.row) : -2;
  const int64_t stats = (static_cast<int64_t>(b) * dims.q_heads + h) * dims.seq + slot.row;

  float q_slice[D / kLanes];
  float do_slice[D / kLanes];
  float dq_acc[D / kLanes];
  LoadSlice<D>(q + q_offset, active, slot.lane, dims.scale, q_slice);
  LoadSlice<D>(dout + q_offset, active, slot.lane, 1.0f, do_slice);
#pragma unroll
  for (int e = 0; e < D / kLanes; ++e) dq_acc[e] = 0.0f;
  const float row_lse = active ? lse[stats] : 0.0f;
  const float row_delta = active ? delta[stats] : 0.0f;

  const int key_end = CausalKeyEnd(blockIdx.x * kRows, kRows, dims.seq);
  const int key_begin =
      SegmentStart(dims, b, min(static_cast<int>(blockIdx.x) * kRows, dims.seq - 1)) / kTile * kTile;
  for (int k0 = key_begin; k0 < key_end; k0 += kTile) {
    __syncthreads();
    LoadTile<D>(k, b, k0, kv_head, dims.kv_heads, dims.seq, 1.0f, k_tile);
    LoadTile<D>(v, b, k0, kv_head, dims.kv_heads, dims.seq, 1.0f, v_tile);
    LoadSegmentTile(dims, b, k0, key_segments);
    __syncthreads();
    for (int j = 0; j < kTile; ++j) {
      const float score = RowDot<D>(q_slice, k_tile[j], slot.lane);
      const float d_prob = RowDot<D>(do_slice, v_tile[j], slot.lane);
      const bool visible = active && k0 + j <= slot.row && key_segments[j] == row_segment;
      const float prob = visible ? AttentionProbability(score, row_lse) : 0.0f;
      const float d_score = AttentionScoreGrad(prob, d_prob, row_delta);
#pragma unroll
      for (int e = 0; e < D / kLanes; ++e) dq_acc[e] += d_score * k_tile[j][slot.lane + kLanes * e];
    }
  }
  if (!active) return;
#pragma unroll
  for (int e = 0; e < D / kLanes; ++e) {
    dq[q_offset + slot.lane + kLanes * e] = S::Make(dq_acc[e] * dims.scale);
  }
}

dim3 Grid(const LaunchShape& shape) {
  return dim3(static_cast<unsigned>(shape.blocks_x), static_cast<unsigned>(shape.blocks_y), 1);
}

Dims ToDims(const launch::AttentionDims& d) {
  return Dims{d.batch, d.seq, d.q_heads, d.kv_heads, d.softmax_scale, d.segments};
}

template <int D>
cudaError_t Forward(const launch::AttentionDims& d, const bf16* q, const bf16* k, const bf16* v,
                    bf16* out, float* lse, cudaStream_t stream) {
  const LaunchShape shape = AttentionGrid(d.seq, d.batch, d.q_heads);
  AttentionForwardKernel<D>
      <<<Grid(shape), shape.threads, 0, stream>>>(ToDims(d), q, k, v, out, lse);
  return cudaGetLastError();
}

template <int D>
cudaError_t Backward(const launch::AttentionDims& d, const bf16* q, const bf16* k, const bf16* v,
                     const bf16* out, const bf16* dout, const float* lse, float* delta, bf16* dq,
                     bf16* dk, bf16* dv, cudaStream_t stream) {
  const Dims dims = ToDims(d);
  const LaunchShape q_shape = AttentionGrid(d.seq, d.batch, d.q_heads);
  AttentionDeltaKernel<D><<<Grid(q_shape), q_shape.threads, 0, stream>>>(dims, out, dout, delta);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const LaunchShape kv_shape = AttentionGrid(d.seq, d.batch, d.kv_heads);
  AttentionDkDvKernel<D>
      <<<Grid(kv_shape), kv_shape.threads, 0, stream>>>(dims, q, k, v, dout, lse, delta, dk, dv);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  AttentionDqKernel<D>
      <<<Grid(q_shape), q_shape.threads, 0, stream>>>(dims, q, k, v, dout, lse, delta, dq);
  return cudaGetLastError();
}

}  // namespace

namespace launch {

cudaError_t AttentionForward(const AttentionDims& dims, const bf16* q, const bf16* k, const bf16* v,
                             bf16* out, float* lse, cudaStream_t stream) {
  switch (dims.head_dim) {
    case 64:
      return Forward<64>(dims, q, k, v, out, lse, stream);
    case 128:
      return Forward<128>(dims, q, k, v, out, lse, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t AttentionBackward(const AttentionDims& dims, const bf16* q, const bf16* k,
                              const bf16* v, const bf16* out, const bf16* dout, const float* lse,
                              float* delta, bf16* dq, bf16* dk, bf16* dv, cudaStream_t stream) {
  switch (dims.head_dim) {
    case 64:
      return Backward<64>(dims, q, k, v, out, dout, lse, delta, dq, dk, dv, stream);
    case 128:
      return Backward<128>(dims, q, k, v, out, dout, lse, delta, dq, dk, dv, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace launch
}  // namespace megatrain::kernels::cuda
