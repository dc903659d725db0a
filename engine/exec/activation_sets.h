// The executor's per-layer device buffer sets, one definition for both backends, templated on
// the element type of the activations (fp32 on the CPU device, bf16 on a GPU; norm and softmax
// statistics are fp32 on both): a layer's saved activations (what its backward reads), the
// backward's gradient scratch, and the head's scratch. Each is carved from one block in a fixed
// order by ByteCarver; a backend's extra pieces (CUDA workspaces) follow a set's own.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/exec/byte_carver.h"
#include "engine/exec/model_dims.h"

namespace megatrain::engine {

// Size and carving of a set from a block; Set::CarveFrom lists its pieces in order.
template <class Set>
struct CarvedSet {
  static size_t Bytes(const ModelDims& m) {
    ByteCarver c(nullptr, Set::kAlignment);
    Set::CarveFrom(m, c);
    return c.used();
  }
  // base: at least Bytes(m) of device memory, aligned to Set::kAlignment.
  static Set Carve(const ModelDims& m, void* base) {
    ByteCarver c(base, Set::kAlignment);
    return Set::CarveFrom(m, c);
  }
};

// What one layer's backward needs, written by its (re)computed forward.
template <typename T>
struct LayerActivationSet : CarvedSet<LayerActivationSet<T>> {
  static constexpr size_t kAlignment = CarveAlignment<T>::kBytes;
  T* x_in = nullptr;      // [N, d] input of the layer
  T* h1 = nullptr;        // [N, d] input norm output
  float* rstd1 = nullptr; // [N]
  T* q = nullptr;         // [N, Hq*D] after RoPE
  T* k = nullptr;         // [N, Hkv*D] after RoPE
  T* v = nullptr;         // [N, Hkv*D]
  T* attn = nullptr;      // [N, Hq*D] attention output (before o_proj)
  float* lse = nullptr;   // [B, Hq, S]
  T* x_mid = nullptr;     // [N, d] after the attention residual
  T* h2 = nullptr;        // [N, d] post-attention norm output
  float* rstd2 = nullptr; // [N]
  T* gate = nullptr;      // [N, F]
  T* up = nullptr;        // [N, F]
  T* act = nullptr;       // [N, F] silu(gate) * up
  // qwen3 (m.qk_norm; empty otherwise): the q/k projections before their
  // per-head RMSNorm (q and k above are normalised, then rotated) and the
  // norms' statistics, one per token and head: what the norms' backward reads.
  T* q_proj = nullptr;       // [N, Hq*D]
  T* k_proj = nullptr;       // [N, Hkv*D]
  float* rstd_q = nullptr;   // [N, Hq]
  float* rstd_k = nullptr;   // [N, Hkv]

  static LayerActivationSet CarveFrom(const ModelDims& m, ByteCarver& c) {
    LayerActivationSet a;
    const int64_t n = m.tokens();
    a.x_in = c.Take<T>(n * m.hidden);
    a.h1 = c.Take<T>(n * m.hidden);
    a.rstd1 = c.Take<float>(n);
    a.q = c.Take<T>(n * m.q_width());
    a.k = c.Take<T>(n * m.kv_width());
    a.v = c.Take<T>(n * m.kv_width());
    a.attn = c.Take<T>(n * m.q_width());
    a.lse = c.Take<float>(m.batch * m.q_heads * m.seq);
    a.x_mid = c.Take<T>(n * m.hidden);
    a.h2 = c.Take<T>(n * m.hidden);
    a.rstd2 = c.Take<float>(n);
    a.gate = c.Take<T>(n * m.ffn);
    a.up = c.Take<T>(n * m.ffn);
    a.act = c.Take<T>(n * m.ffn);
    const int64_t qk = m.qk_norm ? n : 0;
    a.q_proj = c.Take<T>(qk * m.q_width());
    a.k_proj = c.Take<T>(qk * m.kv_width());
    a.rstd_q = c.Take<float>(qk * m.q_heads);
    a.rstd_k = c.Take<float>(qk * m.kv_heads);
    return a;
  }
};

// Gradient scratch of one layer's backward (reused by every layer).
template <typename T>
struct LayerBackwardSet : CarvedSet<LayerBackwardSet<T>> {
  static constexpr size_t kAlignment = CarveAlignment<T>::kBytes;
  T* d_act = nullptr;   // [N, F]
  T* d_gate = nullptr;  // [N, F]
  T* d_up = nullptr;    // [N, F]
  T* d_h = nullptr;     // [N, d]  gradient at a norm's output
  T* d_attn = nullptr;  // [N, Hq*D]; after attention's backward, qwen3's d q/k projection
  T* d_q = nullptr;     // [N, Hq*D]
  T* d_k = nullptr;     // [N, Hkv*D]
  T* d_v = nullptr;     // [N, Hkv*D]

  static LayerBackwardSet CarveFrom(const ModelDims& m, ByteCarver& c) {
    LayerBackwardSet s;
    const int64_t n = m.tokens();
    s.d_act = c.Take<T>(n * m.ffn);
    s.d_gate = c.Take<T>(n * m.ffn);
    s.d_up = c.Take<T>(n * m.ffn);
    s.d_h = c.Take<T>(n * m.hidden);
    s.d_attn = c.Take<T>(n * m.q_width());
    s.d_q = c.Take<T>(n * m.q_width());
    s.d_k = c.Take<T>(n * m.kv_width());
    s.d_v = c.Take<T>(n * m.kv_width());
    return s;
  }
};

// Head: final norm output and its gradient (fp32: added up over the vocabulary blocks), the
// per-token running log-sum-exp over the blocks seen, and one block's logits chunk.
template <typename T>
struct HeadScratchSet : CarvedSet<HeadScratchSet<T>> {
  static constexpr size_t kAlignment = CarveAlignment<T>::kBytes;
  T* h = nullptr;                 // [N, d]
  float* rstd = nullptr;          // [N]
  float* d_h = nullptr;           // [N, d]
  float* row_max = nullptr;       // [N]
  float* row_sum = nullptr;       // [N]
  float* target_logit = nullptr;  // [N]
  T* logits = nullptr;            // [head_chunk, HeadBlockRows]

  static HeadScratchSet CarveFrom(const ModelDims& m, ByteCarver& c) {
    HeadScratchSet h;
    const int64_t n = m.tokens();
    h.h = c.Take<T>(n * m.hidden);
    h.rstd = c.Take<float>(n);
    h.d_h = c.Take<float>(n * m.hidden);
    h.row_max = c.Take<float>(n);
    h.row_sum = c.Take<float>(n);
    h.target_logit = c.Take<float>(n);
    h.logits = c.Take<T>(m.head_chunk * HeadBlockRows(m));
    return h;
  }
};

// The CPU device's sets (fp32).
using LayerActivations = LayerActivationSet<float>;
using LayerBackwardScratch = LayerBackwardSet<float>;
using HeadScratch = HeadScratchSet<float>;

}  // namespace megatrain::engine
