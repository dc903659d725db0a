// Carving of the CUDA layer math's device buffers: consecutive pieces, each
// rounded up to kCudaCarveAlignment bytes, in a fixed order.
#include "engine/exec/cuda_activation_sets.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace megatrain::engine {
namespace {

using bf16 = __nv_bfloat16;

size_t AlignUp(size_t bytes) {
  return (bytes + kCudaCarveAlignment - 1) / kCudaCarveAlignment * kCudaCarveAlignment;
}

// Hands out consecutive aligned pieces of a byte range; with base == nullptr
// it only counts (every pointer it returns is then null).
class ByteCarver {
 public:
  explicit ByteCarver(void* base) : base_(static_cast<char*>(base)) {
    if (reinterpret_cast<uintptr_t>(base) % kCudaCarveAlignment != 0) {
      std::fprintf(stderr, "ByteCarver: base %p is not %zu-byte aligned\n", base,
                   kCudaCarveAlignment);
      std::abort();  // programmer error: the arena hands out aligned blocks
    }
  }
  template <class T>
  T* Take(int64_t count) {
    T* p = base_ != nullptr ? reinterpret_cast<T*>(base_ + used_) : nullptr;
    used_ += AlignUp(sizeof(T) * static_cast<size_t>(count));
    return p;
  }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

CudaActivations CarveInto(const ModelDims& m, ByteCarver& c, CudaActivations*) {
  CudaActivations a;
  const int64_t n = m.tokens();
  a.x_in = c.Take<bf16>(n * m.hidden);
  a.h1 = c.Take<bf16>(n * m.hidden);
  a.rstd1 = c.Take<float>(n);
  a.q = c.Take<bf16>(n * m.q_width());
  a.k = c.Take<bf16>(n * m.kv_width());
  a.v = c.Take<bf16>(n * m.kv_width());
  a.attn = c.Take<bf16>(n * m.q_width());
  a.lse = c.Take<float>(m.batch * m.q_heads * m.seq);
  a.x_mid = c.Take<bf16>(n * m.hidden);
  a.h2 = c.Take<bf16>(n * m.hidden);
  a.rstd2 = c.Take<float>(n);
  a.gate = c.Take<bf16>(n * m.ffn);
  a.up = c.Take<bf16>(n * m.ffn);
  a.act = c.Take<bf16>(n * m.ffn);
  return a;
}

CudaBackwardScratch CarveInto(const ModelDims& m, ByteCarver& c, CudaBackwardScratch*) {
  CudaBackwardScratch s;
  const int64_t n = m.tokens();
  s.d_act = c.Take<bf16>(n * m.ffn);
  s.d_gate = c.Take<bf16>(n * m.ffn);
  s.d_up = c.Take<bf16>(n * m.ffn);
  s.d_h = c.Take<bf16>(n * m.hidden);
  s.d_attn = c.Take<bf16>(n * m.q_width());
  s.d_q = c.Take<bf16>(n * m.q_width());
  s.d_k = c.Take<bf16>(n * m.kv_width());
  s.d_v = c.Take<bf16>(n * m.kv_width());
  s.norm_workspace_floats =
      kernels::cuda::RmsnormBackwardWorkspaceFloats(n, static_cast<int>(m.hidden));
  s.norm_workspace = c.Take<float>(s.norm_workspace_floats);
  s.attention_workspace_bytes =
      kernels::cuda::AttentionBackwardWorkspaceBytes(CudaAttentionShape(m));
  s.attention_workspace = c.Take<char>(static_cast<int64_t>(s.attention_workspace_bytes));
  return s;
}

CudaHeadScratch CarveInto(const ModelDims& m, ByteCarver& c, CudaHeadScratch*) {
  CudaHeadScratch h;
  const int64_t n = m.tokens();
  h.h = c.Take<bf16>(n * m.hidden);
  h.rstd = c.Take<float>(n);
  h.d_h = c.Take<float>(n * m.hidden);
  h.row_max = c.Take<float>(n);
  h.row_sum = c.Take<float>(n);
  h.target_logit = c.Take<float>(n);
  h.logits = c.Take<bf16>(m.head_chunk * HeadBlockRows(m));
  h.logits_f32 = c.Take<float>(CudaHeadLogitsRows(m) * HeadBlockRows(m));
  h.row_loss = c.Take<float>(m.head_chunk);
  h.norm_workspace_floats =
      kernels::cuda::RmsnormBackwardWorkspaceFloats(n, static_cast<int>(m.hidden));
  h.norm_workspace = c.Take<float>(h.norm_workspace_floats);
  return h;
}

CudaLayerTables CarveInto(const ModelDims& m, ByteCarver& c, CudaLayerTables*) {
  CudaLayerTables t;
  t.rope_cos = c.Take<float>(m.seq * (m.head_dim / 2));
  t.rope_sin = c.Take<float>(m.seq * (m.head_dim / 2));
  t.ones = c.Take<bf16>(m.tokens());
  return t;
}

}  // namespace

#define MEGATRAIN_CUDA_CARVED_STRUCT(T)               \
  T T::Carve(const ModelDims& m, void* base) {        \
    ByteCarver c(base);                               \
    return CarveInto(m, c, static_cast<T*>(nullptr)); \
  }                                                   \
  size_t T::Bytes(const ModelDims& m) {               \
    ByteCarver c(nullptr);                            \
    CarveInto(m, c, static_cast<T*>(nullptr));        \
    return c.used();                                  \
  }

MEGATRAIN_CUDA_CARVED_STRUCT(CudaActivations)
MEGATRAIN_CUDA_CARVED_STRUCT(CudaBackwardScratch)
MEGATRAIN_CUDA_CARVED_STRUCT(CudaHeadScratch)
MEGATRAIN_CUDA_CARVED_STRUCT(CudaLayerTables)

#undef MEGATRAIN_CUDA_CARVED_STRUCT

kernels::cuda::AttentionShape CudaAttentionShape(const ModelDims& m) {
  kernels::cuda::AttentionShape s;
  s.batch = static_cast<int>(m.batch);
  s.seq = static_cast<int>(m.seq);
  s.q_heads = static_cast<int>(m.q_heads);
  s.kv_heads = static_cast<int>(m.kv_heads);
  s.head_dim = static_cast<int>(m.head_dim);
  s.softmax_scale = m.head_dim > 0 ? 1.0f / std::sqrt(static_cast<float>(m.head_dim)) : 0.0f;
  return s;
}

int64_t CudaHeadLogitsRows(const ModelDims& m) { return std::min<int64_t>(m.head_chunk, 64); }

int64_t HeadChunkCount(const ModelDims& m) {
  if (m.head_chunk <= 0) return 0;
  return (m.tokens() + m.head_chunk - 1) / m.head_chunk;
}

}  // namespace megatrain::engine
