// Carving of the CUDA layer math's own device buffers (the CUDA extras of the
// executor's sets, and the tables), after the common sets' pieces.
#include "engine/exec/cuda_activation_sets.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "engine/common/fatal.h"

namespace megatrain::engine {
namespace {

using bf16 = __nv_bfloat16;

// The arena hands out kCudaCarveAlignment-aligned blocks; a misaligned base is a programmer
// error that would make cuBLASLt pick another kernel (and other bits).
void CheckAligned(const void* base) {
  if (reinterpret_cast<uintptr_t>(base) % kCudaCarveAlignment != 0) {
    internal::DieBecause("cuda_activation_sets: a carving base is not 256-byte aligned");
  }
}

ByteCarver CudaCarver(void* base) {
  CheckAligned(base);
  return ByteCarver(base, kCudaCarveAlignment);
}

// The CUDA extras follow the common set's pieces in the same block.
CudaBackwardScratch CarveInto(const ModelDims& m, ByteCarver& c, CudaBackwardScratch*) {
  CudaBackwardScratch s;
  static_cast<LayerBackwardSet<bf16>&>(s) = LayerBackwardSet<bf16>::CarveFrom(m, c);
  const int64_t n = m.tokens();
  s.norm_workspace_floats =
      kernels::cuda::RmsnormBackwardWorkspaceFloats(n, static_cast<int>(m.hidden));
  if (m.qk_norm) {  // qwen3's per-head norms: rows of head_dim, one per token and head
    const int head_dim = static_cast<int>(m.head_dim);
    s.norm_workspace_floats = std::max(
        {s.norm_workspace_floats,
         kernels::cuda::RmsnormBackwardWorkspaceFloats(n * m.q_heads, head_dim),
         kernels::cuda::RmsnormBackwardWorkspaceFloats(n * m.kv_heads, head_dim)});
  }
  s.norm_workspace = c.Take<float>(s.norm_workspace_floats);
  s.attention_workspace_bytes = CudaAttentionWorkspaceBytes(m);
  s.attention_workspace = c.Take<char>(static_cast<int64_t>(s.attention_workspace_bytes));
  return s;
}

CudaHeadScratch CarveInto(const ModelDims& m, ByteCarver& c, CudaHeadScratch*) {
  CudaHeadScratch h;
  static_cast<HeadScratchSet<bf16>&>(h) = HeadScratchSet<bf16>::CarveFrom(m, c);
  h.logits_f32 = c.Take<float>(CudaHeadLogitsRows(m) * HeadBlockRows(m));
  h.row_loss = c.Take<float>(m.head_chunk);
  h.norm_workspace_floats =
      kernels::cuda::RmsnormBackwardWorkspaceFloats(m.tokens(), static_cast<int>(m.hidden));
  h.norm_workspace = c.Take<float>(h.norm_workspace_floats);
  return h;
}

CudaLayerTables CarveInto(const ModelDims& m, ByteCarver& c, CudaLayerTables*) {
  CudaLayerTables t;
  t.rope_cos = c.Take<float>(m.seq * (m.head_dim / 2));
  t.rope_sin = c.Take<float>(m.seq * (m.head_dim / 2));
  t.ones = c.Take<bf16>(m.tokens());
  t.attention_forward_workspace_bytes = CudaAttentionForwardWorkspaceBytes(m);
  t.attention_forward_workspace =
      t.attention_forward_workspace_bytes == 0
          ? nullptr
          : c.Take<char>(static_cast<int64_t>(t.attention_forward_workspace_bytes));
  return t;
}

}  // namespace

#define MEGATRAIN_CUDA_CARVED_STRUCT(T)               \
  T T::Carve(const ModelDims& m, void* base) {        \
    ByteCarver c = CudaCarver(base);                  \
    return CarveInto(m, c, static_cast<T*>(nullptr)); \
  }                                                   \
  size_t T::Bytes(const ModelDims& m) {               \
    ByteCarver c(nullptr, kCudaCarveAlignment);       \
    CarveInto(m, c, static_cast<T*>(nullptr));        \
    return c.used();                                  \
  }

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

kernels::cuda::AttentionImpl PlannedAttentionImpl(const ModelDims& m) {
  kernels::cuda::AttentionSelectInputs in;
  in.cudnn_enabled = kernels::cuda::CudnnAttentionAllowedByEnv();
  in.cudnn_built = kernels::cuda::CudnnAttentionBuilt();
  return kernels::cuda::SelectAttentionImpl(CudaAttentionShape(m), in).impl;
}

size_t CudaAttentionWorkspaceBytes(const ModelDims& m) {
  return kernels::cuda::AttentionWorkspaceBytes(CudaAttentionShape(m), PlannedAttentionImpl(m));
}

size_t CudaAttentionForwardWorkspaceBytes(const ModelDims& m) {
  return kernels::cuda::AttentionForwardWorkspaceBytes(CudaAttentionShape(m),
                                                       PlannedAttentionImpl(m));
}

int64_t CudaHeadLogitsRows(const ModelDims& m) { return std::min<int64_t>(m.head_chunk, 64); }

int64_t HeadChunkCount(const ModelDims& m) {
  if (m.head_chunk <= 0) return 0;
  return (m.tokens() + m.head_chunk - 1) / m.head_chunk;
}

}  // namespace megatrain::engine
