// Checked entry points of the CUDA kernels: validate sizes, launch on the
// given stream (never the default stream), check the launch, and return an
// absl::Status naming the bad field or carrying the CUDA error string.
// Plain C++ (callable from g++); tensors are device pointers passed as void*
// holding bf16 (`__nv_bfloat16`) unless typed otherwise; math is fp32.
// All launches are asynchronous: an OK status means "launched", and faults
// inside a kernel surface at the next synchronisation.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace megatrain::kernels::cuda {

// out[t, :] = table[ids[t], :] for t < tokens. ids: int32 device array; an
// id outside [0, vocab) makes its output row NaN (validate ids on the host).
absl::Status EmbeddingForward(const int32_t* ids, int64_t tokens, const void* table, int64_t vocab,
                              int dim, void* out, cudaStream_t stream);

// dtable[row, :] += sum of dout[t, :] over the tokens t with ids[t] == row,
// summed in token order. The three int32 arrays are the device copies of a
// host EmbeddingGradIndex (embedding_grad_index.h); dtable is fp32 [vocab,
// dim]. Deterministic: one thread owns each (row, column), no atomics.
absl::Status EmbeddingBackward(const int32_t* unique_rows, const int32_t* segment_offsets,
                               const int32_t* token_order, int64_t unique_count, int64_t tokens,
                               const void* dout, int dim, float* dtable, cudaStream_t stream);

// out = a + b over n elements (out may alias a or b).
absl::Status ResidualAdd(const void* a, const void* b, void* out, int64_t n, cudaStream_t stream);

// sum[i] += g[i] for i < n, fp32 (the executor's gradient accumulation on the device): bit for
// bit the host's add of the same values.
absl::Status AccumulateFp32(const float* g, float* sum, int64_t n, cudaStream_t stream);

// out (bf16 [n]) = in (fp32 [n]) rounded to nearest even.
absl::Status RoundToBf16(const float* in, void* out, int64_t n, cudaStream_t stream);

// out = silu(gate) * up over n elements.
absl::Status SwigluForward(const void* gate, const void* up, void* out, int64_t n,
                           cudaStream_t stream);

// d_gate, d_up from dy for out = silu(gate) * up.
absl::Status SwigluBackward(const void* gate, const void* up, const void* dy, void* d_gate,
                            void* d_up, int64_t n, cudaStream_t stream);

// Rotate-half RoPE in place on x [tokens, heads, head_dim] (head_dim even),
// token t at position t % seq (tokens = batch * seq), or at positions[t] when `positions` (device
// int32 [tokens], each in [0, seq): packed samples restart at 0) is given. cos_table/sin_table:
// fp32 [seq, head_dim / 2], built on the host from RopeInverseFrequency.
// backward = true applies the inverse rotation (for the gradient).
absl::Status RopeInPlace(void* x, int64_t tokens, int heads, int head_dim, int seq,
                         const float* cos_table, const float* sin_table, bool backward,
                         cudaStream_t stream, const int32_t* positions = nullptr);

// y = x * rstd * w over rows of width dim; rstd: fp32 [rows] saved for backward.
absl::Status RmsnormForward(const void* x, const void* w, int64_t rows, int dim, float eps, void* y,
                            float* rstd, cudaStream_t stream);

// fp32 floats of scratch RmsnormBackward needs for the dw partials.
int64_t RmsnormBackwardWorkspaceFloats(int64_t rows, int dim);

// dx = (or += when accumulate_dx) the input gradient; dw (fp32 [dim]) +=
// the weight gradient, reduced in a fixed order via `workspace` (at least
// RmsnormBackwardWorkspaceFloats floats).
absl::Status RmsnormBackward(const void* x, const void* w, const float* rstd, const void* dy,
                             int64_t rows, int dim, bool accumulate_dx, void* dx, float* dw,
                             float* workspace, int64_t workspace_floats, cudaStream_t stream);

// Cross-entropy over a chunk of logits [rows, vocab] with int32 targets:
// row_loss[r] = logsumexp(row) - logit[target] (0 where target < 0, NaN where
// target >= vocab); dlogits = (softmax - onehot(target)) * scale (0 for
// ignored rows; may alias logits); *loss_sum (one fp32 on the device) = sum
// of row_loss in a fixed order.
absl::Status CrossEntropy(const void* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                          float scale, void* dlogits, float* row_loss, float* loss_sum,
                          cudaStream_t stream);

// Cross-entropy over vocabulary blocks (the LM head streamed block by block).
// Per-row running states (fp32 [rows] each: max, sum of exp(x - max), the
// target's logit): HeadStatsReset empties them; HeadBlockStats folds one
// block's logits [rows, block_vocab] (columns first_row.. of the vocabulary)
// into the valid rows' states; after every block, HeadLossFromStats writes
// row_loss (0 for ignored rows, NaN for a target no block held) and
// *loss_sum as CrossEntropy does, and HeadBlockGrad writes a block's dlogits
// (may alias logits; 0 for ignored rows).
absl::Status HeadStatsReset(int64_t rows, float* row_max, float* row_sum, float* target_logit,
                            cudaStream_t stream);
absl::Status HeadBlockStats(const void* logits, const int32_t* targets, int64_t rows,
                            int64_t block_vocab, int64_t first_row, float* row_max,
                            float* row_sum, float* target_logit, cudaStream_t stream);
absl::Status HeadLossFromStats(const float* row_max, const float* row_sum,
                               const float* target_logit, const int32_t* targets, int64_t rows,
                               float* row_loss, float* loss_sum, cudaStream_t stream);
absl::Status HeadBlockGrad(const void* logits, const int32_t* targets, int64_t rows,
                           int64_t block_vocab, int64_t first_row, const float* row_max,
                           const float* row_sum, float scale, void* dlogits, cudaStream_t stream);

// Causal GQA attention. q/out [batch, seq, q_heads, head_dim], k/v [batch,
// seq, kv_heads, head_dim]; q_heads a multiple of kv_heads; head_dim 64 or
// 128; softmax_scale usually 1/sqrt(head_dim).
struct AttentionShape {
  int batch = 0;
  int seq = 0;
  int q_heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  float softmax_scale = 0.0f;
  // Device int32 [batch, seq] segment ids (packed samples), non-decreasing along each sequence:
  // key j is visible to query i iff same segment and j <= i; key tiles no row of a block sees
  // are skipped. null = one segment per sequence (plain causal).
  const int32_t* segments = nullptr;
};

// out = softmax(scale q k^T + causal (and segment) mask) v; lse: fp32 [batch, q_heads, seq].
absl::Status AttentionForward(const AttentionShape& shape, const void* q, const void* k,
                              const void* v, void* out, float* lse, cudaStream_t stream);

// Bytes of scratch AttentionBackward needs.
size_t AttentionBackwardWorkspaceBytes(const AttentionShape& shape);

// dq, dk, dv (written, not accumulated) from dout, given the forward's q, k,
// v, out and lse. Deterministic (no atomics).
absl::Status AttentionBackward(const AttentionShape& shape, const void* q, const void* k,
                               const void* v, const void* out, const void* dout, const float* lse,
                               void* dq, void* dk, void* dv, void* workspace,
                               size_t workspace_bytes, cudaStream_t stream);

}  // namespace megatrain::kernels::cuda
