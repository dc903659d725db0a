// Stream-taking launchers of the CUDA kernels (defined in the .cu files). They
// trust their arguments (ops.h validates them) and return cudaGetLastError()
// after their launches. Internal to //kernels/cuda.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace megatrain::kernels::cuda::launch {

using bf16 = __nv_bfloat16;

// elementwise.cu
cudaError_t EmbeddingForward(const int32_t* ids, int64_t tokens, const bf16* table, int64_t vocab,
                             int dim, bf16* out, cudaStream_t stream);
cudaError_t EmbeddingBackward(const int32_t* unique_rows, const int32_t* segment_offsets,
                              const int32_t* token_order, int64_t unique_count, const bf16* dout,
                              int dim, float* dtable, cudaStream_t stream);
cudaError_t ResidualAdd(const bf16* a, const bf16* b, bf16* out, int64_t n, cudaStream_t stream);
cudaError_t RoundToBf16(const float* in, bf16* out, int64_t n, cudaStream_t stream);
cudaError_t AccumulateFp32(const float* g, float* sum, int64_t n, cudaStream_t stream);
cudaError_t SwigluForward(const bf16* gate, const bf16* up, bf16* out, int64_t n,
                          cudaStream_t stream);
cudaError_t SwigluBackward(const bf16* gate, const bf16* up, const bf16* dy, bf16* d_gate,
                           bf16* d_up, int64_t n, cudaStream_t stream);
cudaError_t Rope(bf16* x, int64_t tokens, int heads, int head_dim, int seq, const float* cos_table,
                 const float* sin_table, const int32_t* positions, bool backward,
                 cudaStream_t stream);

// rmsnorm.cu
cudaError_t RmsnormForward(const bf16* x, const bf16* w, int64_t rows, int dim, float eps, bf16* y,
                           float* rstd, cudaStream_t stream);
cudaError_t RmsnormBackward(const bf16* x, const bf16* w, const float* rstd, const bf16* dy,
                            int64_t rows, int dim, bool accumulate_dx, bf16* dx, float* dw_partials,
                            float* dw, cudaStream_t stream);

// cross_entropy.cu
cudaError_t CrossEntropy(const bf16* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                         float scale, bf16* dlogits, float* row_loss, float* loss_sum,
                         cudaStream_t stream);
cudaError_t HeadStatsReset(int64_t rows, float* row_max, float* row_sum, float* target_logit,
                           cudaStream_t stream);
cudaError_t HeadBlockStats(const bf16* logits, const int32_t* targets, int64_t rows,
                           int64_t block_vocab, int64_t first_row, float* row_max, float* row_sum,
                           float* target_logit, cudaStream_t stream);
cudaError_t HeadBlockGrad(const bf16* logits, const int32_t* targets, int64_t rows,
                          int64_t block_vocab, int64_t first_row, const float* row_max,
                          const float* row_sum, float scale, bf16* dlogits, cudaStream_t stream);
cudaError_t HeadLossFromStats(const float* row_max, const float* row_sum,
                              const float* target_logit, const int32_t* targets, int64_t rows,
                              float* row_loss, float* loss_sum, cudaStream_t stream);

// attention.cu
struct AttentionDims {
  int batch;
  int seq;
  int q_heads;
  int kv_heads;
  int head_dim;
  float softmax_scale;
  const int32_t* segments;  // [batch, seq] or null (ops.h AttentionShape)
};
cudaError_t AttentionForward(const AttentionDims& dims, const bf16* q, const bf16* k, const bf16* v,
                             bf16* out, float* lse, cudaStream_t stream);
cudaError_t AttentionBackward(const AttentionDims& dims, const bf16* q, const bf16* k,
                              const bf16* v, const bf16* out, const bf16* dout, const float* lse,
                              float* delta, bf16* dq, bf16* dk, bf16* dv, cudaStream_t stream);

}  // namespace megatrain::kernels::cuda::launch
