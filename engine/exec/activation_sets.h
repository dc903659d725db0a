// Device-side buffers of the streaming executor, carved from the arena in one
// fixed plan: the saved activations of a layer (what its backward reads), the
// backward scratch, the residual-stream ping-pong and the head's chunk.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/exec/model_dims.h"

namespace megatrain::engine {

// What one layer's backward needs, written by its (re)computed forward.
struct LayerActivations {
  float* x_in = nullptr;   // [N, d] input of the layer
  float* h1 = nullptr;     // [N, d] input norm output
  float* rstd1 = nullptr;  // [N]
  float* q = nullptr;      // [N, Hq*D] after RoPE
  float* k = nullptr;      // [N, Hkv*D] after RoPE
  float* v = nullptr;      // [N, Hkv*D]
  float* attn = nullptr;   // [N, Hq*D] attention output (before o_proj)
  float* lse = nullptr;    // [B, Hq, S]
  float* x_mid = nullptr;  // [N, d] after the attention residual
  float* h2 = nullptr;     // [N, d] post-attention norm output
  float* rstd2 = nullptr;  // [N]
  float* gate = nullptr;   // [N, F]
  float* up = nullptr;     // [N, F]
  float* act = nullptr;    // [N, F] silu(gate) * up

  static size_t FloatCount(const ModelDims& m);
  static LayerActivations Carve(const ModelDims& m, float* base);
};

// Scratch of one layer's backward (reused by every layer).
struct LayerBackwardScratch {
  float* d_act = nullptr;   // [N, F]
  float* d_gate = nullptr;  // [N, F]
  float* d_up = nullptr;    // [N, F]
  float* d_h = nullptr;     // [N, d]  gradient at a norm's output
  float* d_attn = nullptr;  // [N, Hq*D]
  float* d_q = nullptr;     // [N, Hq*D]
  float* d_k = nullptr;     // [N, Hkv*D]
  float* d_v = nullptr;     // [N, Hkv*D]

  static size_t FloatCount(const ModelDims& m);
  static LayerBackwardScratch Carve(const ModelDims& m, float* base);
};

// Head: final norm output and its gradient, the per-token running
// log-sum-exp over the vocabulary blocks seen, and one block's logits chunk.
struct HeadScratch {
  float* h = nullptr;             // [N, d]
  float* rstd = nullptr;          // [N]
  float* d_h = nullptr;           // [N, d]
  float* row_max = nullptr;       // [N]
  float* row_sum = nullptr;       // [N]
  float* target_logit = nullptr;  // [N]
  float* logits = nullptr;        // [head_chunk, HeadBlockRows]

  static size_t FloatCount(const ModelDims& m);
  static HeadScratch Carve(const ModelDims& m, float* base);
};

}  // namespace megatrain::engine
