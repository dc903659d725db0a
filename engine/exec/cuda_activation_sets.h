// Device buffers of the CUDA layer math, carved from the executor's arena in
// one fixed plan (never cudaMalloc'd inside a step): the bf16 instances of the
// executor's sets (activation_sets.h) with the CUDA kernels' workspaces, and
// CudaLayerMath's constant tables.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "engine/exec/activation_sets.h"
#include "engine/exec/model_dims.h"
#include "kernels/cuda/attention_select.h"
#include "kernels/cuda/ops.h"

namespace megatrain::engine {

// Every carved piece starts at a multiple of this many bytes from the base
// (cuBLASLt's preferred operand alignment); the base itself must be aligned
// to it too.
inline constexpr size_t kCudaCarveAlignment = 256;

template <>
struct CarveAlignment<__nv_bfloat16> {
  static constexpr size_t kBytes = kCudaCarveAlignment;
};

// What one layer's backward reads (bf16, statistics fp32); base kCudaCarveAlignment-aligned.
using CudaActivations = LayerActivationSet<__nv_bfloat16>;

// Scratch of one layer's backward (reused by every layer): the gradients, then the kernels'
// workspaces.
struct CudaBackwardScratch : LayerBackwardSet<__nv_bfloat16> {
  float* norm_workspace = nullptr;  // RmsnormBackwardWorkspaceFloats(N, d)
  int64_t norm_workspace_floats = 0;
  // The attention backward's workspace: CudaAttentionWorkspaceBytes (our
  // kernel's, or cuDNN's estimate when the plan reserves for cuDNN).
  void* attention_workspace = nullptr;
  size_t attention_workspace_bytes = 0;

  static size_t Bytes(const ModelDims& m);
  static CudaBackwardScratch Carve(const ModelDims& m, void* base);
};

// Head: the common head set (h and logits bf16; h holds the rounded d_h once every block's
// backward ran, logits are overwritten by d logits), then the CUDA head's own pieces.
struct CudaHeadScratch : HeadScratchSet<__nv_bfloat16> {
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
  // cuDNN attention forward's workspace (CudaAttentionForwardWorkspaceBytes;
  // none when the plan reserves for our kernel). Every forward of the run
  // uses it in stream order on the compute stream.
  void* attention_forward_workspace = nullptr;
  size_t attention_forward_workspace_bytes = 0;

  static size_t Bytes(const ModelDims& m);
  static CudaLayerTables Carve(const ModelDims& m, void* base);
};

// The attention kernels' view of a micro-batch (softmax scale 1/sqrt(D)).
kernels::cuda::AttentionShape CudaAttentionShape(const ModelDims& m);

// The attention implementation the memory plan reserves for: the selection
// of attention_select.h with the device not yet known (compute capability and
// cuDNN version 0) and the switch read from MEGATRAIN_CUDNN_ATTENTION.
// CudaLayerMath::Create decides again on the device and falls back to our
// kernel when cuDNN's plans need more than these reservations.
kernels::cuda::AttentionImpl PlannedAttentionImpl(const ModelDims& m);
// Workspace bytes the plan reserves for attention's backward and forward.
size_t CudaAttentionWorkspaceBytes(const ModelDims& m);
size_t CudaAttentionForwardWorkspaceBytes(const ModelDims& m);

// Rows of the logits form's fp32 staging (tests and sampling; min(head_chunk, 64)).
int64_t CudaHeadLogitsRows(const ModelDims& m);

// Number of token chunks of the fused head: ceil(N / head_chunk).
int64_t HeadChunkCount(const ModelDims& m);

}  // namespace megatrain::engine
