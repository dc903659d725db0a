// Device buffers of the CUDA layer math, carved from the executor's arena in
// one fixed plan (never cudaMalloc'd inside a step): a layer's saved
// activations (bf16, plus fp32 norm and softmax statistics), the backward
// scratch, the head's scratch and CudaLayerMath's constant tables.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "engine/exec/model_dims.h"
#include "kernels/cuda/ops.h"

namespace megatrain::engine {

// Every carved piece starts at a multiple of this many bytes from the base
// (cuBLASLt's preferred operand alignment); the base itself must be aligned
// to it too.
inline constexpr size_t kCudaCarveAlignment = 256;

// What one layer's backward reads, written by its (re)computed forward.
struct CudaActivations {
  __nv_bfloat16* x_in = nullptr;   // [N, d] input of the layer
  __nv_bfloat16* h1 = nullptr;     // [N, d] input norm output
  float* rstd1 = nullptr;          // [N]
  __nv_bfloat16* q = nullptr;      // [N, Hq*D] after RoPE
  __nv_bfloat16* k = nullptr;      // [N, Hkv*D] after RoPE
  __nv_bfloat16* v = nullptr;      // [N, Hkv*D]
  __nv_bfloat16* attn = nullptr;   // [N, Hq*D] attention output (before o_proj)
  float* lse = nullptr;            // [B, Hq, S]
  __nv_bfloat16* x_mid = nullptr;  // [N, d] after the attention residual
  __nv_bfloat16* h2 = nullptr;     // [N, d] post-attention norm output
  float* rstd2 = nullptr;          // [N]
  __nv_bfloat16* gate = nullptr;   // [N, F]
  __nv_bfloat16* up = nullptr;     // [N, F]
  __nv_bfloat16* act = nullptr;    // [N, F] silu(gate) * up

  static size_t Bytes(const ModelDims& m);
  // base: kCudaCarveAlignment-aligned device memory of at least Bytes(m).
  static CudaActivations Carve(const ModelDims& m, void* base);
};

// Scratch of one layer's backward (reused by every layer).
struct CudaBackwardScratch {
  __nv_bfloat16* d_act = nullptr;   // [N, F]
  __nv_bfloat16* d_gate = nullptr;  // [N, F]
  __nv_bfloat16* d_up = nullptr;    // [N, F]
  __nv_bfloat16* d_h = nullptr;     // [N, d] gradient at a norm's output
  __nv_bfloat16* d_attn = nullptr;  // [N, Hq*D]
  __nv_bfloat16* d_q = nullptr;     // [N, Hq*D]
  __nv_bfloat16* d_k = nullptr;     // [N, Hkv*D]
  __nv_bfloat16* d_v = nullptr;     // [N, Hkv*D]
  float* norm_workspace = nullptr;  // RmsnormBackwardWorkspaceFloats(N, d)
  int64_t norm_workspace_floats = 0;
  void* attention_workspace = nullptr;  // AttentionBackwardWorkspaceBytes
  size_t attention_workspace_bytes = 0;

  static size_t Bytes(const ModelDims& m);
  static CudaBackwardScratch Carve(const ModelDims& m, void* base);
};

// Head: final norm output and its gradient, one chunk of logits.
struct CudaHeadScratch {
  __nv_bfloat16* h = nullptr;       // [N, d]; the rounded d_h once every block's backward ran
  float* rstd = nullptr;            // [N]
  float* d_h = nullptr;             // [N, d] fp32: added up over the vocabulary blocks
  float* row_max = nullptr;         // [N] running log-sum-exp state per token
  float* row_sum = nullptr;         // [N]
  float* target_logit = nullptr;    // [N]
  __nv_bfloat16* logits = nullptr;  // [head_chunk, HeadBlockRows]; overwritten by d logits
  float* logits_f32 = nullptr;      // [CudaHeadLogitsRows, HeadBlockRows]: the logits form's
  float* row_loss = nullptr;        // [head_chunk]
  float* norm_workspace = nullptr;  // RmsnormBackwardWorkspaceFloats(N, d)
  int64_t norm_workspace_floats = 0;

  static size_t Bytes(const ModelDims& m);
  static CudaHeadScratch Carve(const ModelDims& m, void* base);
};

// Constants CudaLayerMath uploads once at Create.
struct CudaLayerTables {
  float* rope_cos = nullptr;      // [S, D/2] cos of position * inverse frequency
  float* rope_sin = nullptr;      // [S, D/2]
  __nv_bfloat16* ones = nullptr;  // [N] all 1.0: broadcasts and sums biases via GEMMs

  static size_t Bytes(const ModelDims& m);
  static CudaLayerTables Carve(const ModelDims& m, void* base);
};

// The attention kernels' view of a micro-batch (softmax scale 1/sqrt(D)).
kernels::cuda::AttentionShape CudaAttentionShape(const ModelDims& m);

// Rows of the logits form's fp32 staging (tests and sampling; min(head_chunk, 64)).
int64_t CudaHeadLogitsRows(const ModelDims& m);

// Number of token chunks of the fused head: ceil(N / head_chunk).
int64_t HeadChunkCount(const ModelDims& m);

}  // namespace megatrain::engine
