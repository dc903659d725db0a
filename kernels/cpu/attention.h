// Causal grouped-query attention with optional sliding window, flash-style:
// tiled over query and key blocks with an online softmax, so memory is linear
// in sequence length; backward recomputes score tiles from the saved lse.
//
// Single-threaded in our code (loops over batch, heads and tiles in a fixed
// order); the per-tile GEMMs are cblas_sgemm calls, which OpenBLAS runs on one
// thread while M*N*K <= 262144 (64x64 tiles with head_dim <= 64); larger ones
// use the run's fixed BLAS thread count, still deterministically.
// Tile sizes are part of the numerics: results differ in rounding between
// tilings, so the engine fixes them per model (default 64 x 64) and never
// derives them from memory budgets.
#pragma once

#include <cstddef>
#include <cstdint>

namespace megatrain::kernels::cpu {

struct AttentionShape {
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t q_heads = 0;   // Hq; a multiple of kv_heads
  int64_t kv_heads = 0;  // Hkv; query head h reads kv head h / (Hq / Hkv)
  int64_t head_dim = 0;  // D
  float scale = 0.0f;    // softmax scale, normally 1 / sqrt(D)
  // Sliding window W: key j is visible to query i iff j <= i and i - j < W.
  // 0 = none (plain causal).
  int64_t window = 0;
};

struct AttentionTiles {
  int64_t q_tile = 64;  // query rows per tile
  int64_t k_tile = 64;  // key rows per tile
};

// Workspace sizes in floats. Forward: q_tile * k_tile + 2 * q_tile.
// Backward: 2 * q_tile * k_tile + seq. (Each call also holds S integers of its own: every
// query's first visible key.)
size_t AttentionForwardWorkspaceFloats(const AttentionShape& shape, const AttentionTiles& tiles);
size_t AttentionBackwardWorkspaceFloats(const AttentionShape& shape, const AttentionTiles& tiles);

// Segment ids (packed samples): `segments` [B, S], non-decreasing along each sequence (each
// segment one contiguous run of tokens), or null for one segment per sequence. Key j is then
// visible to query i iff segments[j] == segments[i], j <= i, and the window allows it. Key
// tiles no query of a tile can see are skipped (packing costs no FLOPs across samples), and
// with every id equal the results are bitwise those of null.

// q: [B, S, Hq, D]; k, v: [B, S, Hkv, D]. Writes out [B, S, Hq, D] and
// lse [B, Hq, S] (natural log of the softmax denominator of each scaled row,
// kept for the backward). workspace: AttentionForwardWorkspaceFloats floats
// supplied by the caller, or null to allocate it inside.
void AttentionForward(const AttentionShape& shape, const AttentionTiles& tiles, const float* q,
                      const float* k, const float* v, float* out, float* lse, float* workspace,
                      const int32_t* segments = nullptr);

// FlashAttention-2 backward. Given the forward's inputs, out and lse, and
// dout [B, S, Hq, D], OVERWRITES dq [B, S, Hq, D], dk and dv [B, S, Hkv, D].
// dk/dv of a kv head sum its query heads in increasing head order, each over
// query tiles in increasing order; dq sums key tiles in increasing order.
// workspace: AttentionBackwardWorkspaceFloats floats, or null to allocate inside.
void AttentionBackward(const AttentionShape& shape, const AttentionTiles& tiles, const float* q,
                       const float* k, const float* v, const float* out, const float* lse,
                       const float* dout, float* dq, float* dk, float* dv, float* workspace,
                       const int32_t* segments = nullptr);

}  // namespace megatrain::kernels::cpu
