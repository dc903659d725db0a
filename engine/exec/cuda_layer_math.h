// The math of one Llama-family decoder layer, the embedding and the head on a
// CUDA device: the twin of cpu_layer_math, step for step, over kernels/cuda
// (bf16 storage, fp32 math) and cuBLASLt GEMMs (bf16 in, fp32 accumulate,
// never split along K). Weights are a layer's bf16 compute copy packed like
// its fp32 master (LayerOffsets); weight gradients are fp32 packed the same
// way and are ADDED to, like the CPU version. Every method only enqueues work
// on the given stream (never a default stream) and returns the launch status;
// faults inside a kernel surface at the caller's next synchronisation.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/exec/cuda_activation_sets.h"
#include "engine/exec/fragment_parts.h"
#include "engine/exec/model_dims.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/attention_select.h"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/gemm.h"

namespace megatrain::engine {

// Device copies of a host kernels::cuda::EmbeddingGradIndex of the batch's ids.
struct CudaEmbeddingGradIndex {
  const int32_t* unique_rows = nullptr;
  const int32_t* segment_offsets = nullptr;
  const int32_t* token_order = nullptr;
  int64_t unique_count = 0;
};

// Choices fixed at Create (documented with their "off" value).
struct CudaLayerMathOptions {
  // Attention through cuDNN's fused SDPA where attention_select.h allows it;
  // false = always our own kernel (also forced for the whole process by
  // MEGATRAIN_CUDNN_ATTENTION=0, which the memory plan reads as well).
  bool cudnn_attention = true;
  // Device int32 [batch * seq] arrays the executor rewrites before each micro-batch (packed
  // samples): each token's position (RoPE; null = t % seq) and segment id (attention sees only
  // keys of the query's segment; non-null rules out cuDNN, attention_select.h rule 0).
  const int32_t* positions = nullptr;
  const int32_t* segments = nullptr;
};

class CudaLayerMath {
 public:
  using bf16 = __nv_bfloat16;
  using Weights = LayerWeightsOf<bf16>;

  // Device bytes of the constant tables Create uploads (carved by the caller).
  static size_t TablesBytes(const ModelDims& dims) { return CudaLayerTables::Bytes(dims); }

  // What Create checks before touching the device: dims the kernels handle
  // (attention: head_dim 64 or 128, q_heads a multiple of kv_heads, no
  // sliding window shorter than the sequence; sizes within int range), the
  // offsets of every mandatory tensor, and a RoPE table for these dims.
  // InvalidArgument / Unimplemented naming the field and its value.
  static absl::Status Validate(const ModelDims& dims, const LayerOffsets& offsets,
                               const kernels::cpu::RopeTable& rope);

  // Creates the cuBLASLt handle and its fixed workspace (cudaMalloc'd here,
  // outside any step) and uploads the RoPE cos/sin rows 0..seq-1 of `rope`
  // (the CPU device's table, so both backends rotate by the same fp32
  // values) and a ones vector into `device_tables_base` (TablesBytes(dims),
  // kCudaCarveAlignment-aligned). Waits for setup_stream before returning.
  // Chooses the attention implementation once (attention_impl()): with cuDNN
  // it creates the handle and builds the forward and backward graphs of the
  // micro-batch's shape here; cuDNN refusing the shape, or its plans needing
  // more workspace than the plan reserved (CudaAttentionWorkspaceBytes /
  // CudaAttentionForwardWorkspaceBytes), falls back to our kernel for both
  // directions, with the reason in attention_reason().
  static absl::StatusOr<CudaLayerMath> Create(const ModelDims& dims, const LayerOffsets& offsets,
                                              const kernels::cpu::RopeTable& rope,
                                              void* device_tables_base, cudaStream_t setup_stream,
                                              const CudaLayerMathOptions& options = {});

  CudaLayerMath(CudaLayerMath&&) noexcept = default;
  CudaLayerMath& operator=(CudaLayerMath&&) noexcept = default;
  CudaLayerMath(const CudaLayerMath&) = delete;
  CudaLayerMath& operator=(const CudaLayerMath&) = delete;

  const ModelDims& dims() const { return dims_; }
  // Which attention every forward and backward of this instance runs, and why.
  kernels::cuda::AttentionImpl attention_impl() const { return attention_impl_; }
  const std::string& attention_reason() const { return attention_reason_; }

  // x_out[N, d] = table[ids] (ids: int32 [N] in [0, vocab), validated by the
  // caller on the host; table bf16 [vocab, d]).
  absl::Status EmbedForward(const int32_t* ids, const bf16* table, bf16* x_out,
                            cudaStream_t stream) const;

  // dtable (fp32 [vocab, d]) += the scatter of dx [N, d] by token id, each
  // row summed in token order.
  absl::Status EmbedBackward(const CudaEmbeddingGradIndex& index, const bf16* dx, float* dtable,
                             cudaStream_t stream) const;

  // x_out = layer(x_in); `act` receives everything backward needs (act.x_in
  // a copy of x_in). x_out may not alias x_in.
  absl::Status LayerForward(const bf16* weights, const bf16* x_in, CudaActivations& act,
                            bf16* x_out, cudaStream_t stream) const;
  // The same as its kLayerParts parts (fragment_parts.h) enqueued in order;
  // part p reads only ForwardPartTensor(p) and its bias through `weights`.
  absl::Status LayerForwardPart(int part, const Weights& weights, const bf16* x_in,
                                CudaActivations& act, bf16* x_out, cudaStream_t stream) const;

  // dx_in = d loss / d x_in given dx_out, from the saved activations; weight
  // gradients are ADDED into `grads` (fp32, packed like `weights`). dx_in may
  // not alias dx_out.
  absl::Status LayerBackward(const bf16* weights, const CudaActivations& act,
                             CudaBackwardScratch& scratch, const bf16* dx_out, bf16* dx_in,
                             float* grads, cudaStream_t stream) const;
  // Backward part p: reads only BackwardPartTensor(p) and its bias; grads
  // are packed like the layer entry (the offsets given to Create).
  absl::Status LayerBackwardPart(int part, const Weights& weights, const CudaActivations& act,
                                 CudaBackwardScratch& scratch, const bf16* dx_out, bf16* dx_in,
                                 float* grads, cudaStream_t stream) const;

  // Pointers of one head step (cpu_layer_math.h CpuHeadArgs, bf16 weights and
  // activations, fp32 gradients and logits). The unscaled loss of token chunk
  // c goes to chunk_loss_sums[c] (fp32 device array of HeadChunkCount(dims));
  // the caller copies it out and adds it up with SumChunkLosses. The
  // valid-token count is the caller's (it has the targets on the host).
  struct HeadPointers {
    HeadForm form = HeadForm::kTrain;
    const bf16* final_norm = nullptr;
    const bf16* lm_block = nullptr;  // rows of the step's vocabulary block
    const bf16* x_final = nullptr;
    const int32_t* targets = nullptr;  // int32 [N], < 0 = ignored
    float inv_total_valid = 0.0f;
    bf16* dx_final = nullptr;          // OVERWRITTEN
    float* final_norm_grad = nullptr;  // OVERWRITTEN
    float* lm_block_grad = nullptr;    // OVERWRITTEN: the block's [rows, d]
    float* logits = nullptr;           // kLogits: [N, vocab]
    float* chunk_loss_sums = nullptr;
  };

  // One step of the head (fragment_parts.h HeadStepAt): final norm, a block's
  // forward (logits folded into the running log-sum-exp, or written out; the
  // last block writes the chunk losses), a block's backward, the final norm's
  // backward. dx_final = d(loss)/d(x_final), loss = loss_sum * inv_total_valid.
  absl::Status HeadStep(HeadStep step, const HeadPointers& p, CudaHeadScratch& scratch,
                        cudaStream_t stream) const;
  // Every step in order with lm_head ([vocab, d]) and lm_head_grad whole.
  absl::Status Head(HeadPointers p, const bf16* lm_head, float* lm_head_grad,
                    CudaHeadScratch& scratch, cudaStream_t stream) const;

  // Host: the loss sum of a micro-batch from the downloaded chunk sums,
  // added in chunk order in a double.
  static double SumChunkLosses(std::span<const float> chunk_loss_sums);

 private:
  CudaLayerMath(const ModelDims& dims, const LayerOffsets& offsets, CudaLayerTables tables,
                kernels::cuda::CublasLtGemm gemm)
      : dims_(dims), offsets_(offsets), tables_(tables), gemm_(std::move(gemm)) {}

  // The selected attention (forward saves lse, backward reads it: always the
  // same implementation for both).
  absl::Status AttentionForward(const CudaActivations& act, bf16* out, float* lse,
                                cudaStream_t stream) const;
  absl::Status AttentionBackward(const CudaActivations& act, CudaBackwardScratch& scratch,
                                 cudaStream_t stream) const;

  // y[N, out] = x[N, in] W^T (+ bias).
  absl::Status Linear(const bf16* x, const bf16* w, const bf16* bias, int64_t in, int64_t out,
                      bf16* y, cudaStream_t stream) const;
  // y[N, out] = residual + x W^T (+ bias), adding onto the residual inside
  // the GEMM (beta = 1, read from the residual: C != D, no copy). y may not
  // alias x or residual.
  absl::Status LinearAddTo(const bf16* x, const bf16* w, const bf16* bias, int64_t in, int64_t out,
                           const bf16* residual, bf16* y, cudaStream_t stream) const;
  // y = (source when accumulate) + bias broadcast over the tokens + x W^T;
  // source null: y itself.
  absl::Status BiasAndProduct(const bf16* x, const bf16* w, const bf16* bias, int64_t in,
                              int64_t out, bool accumulate, const bf16* source, bf16* y,
                              cudaStream_t stream) const;
  // out[N, heads*D] = x W^T (+ bias); with a head norm (qwen3) the projection
  // goes to `proj` and each head's [D] row is RMS-normalised into `out`
  // (statistics to rstd [N, heads]).
  absl::Status ProjectHeads(const bf16* x, const bf16* w, const bf16* bias, const bf16* head_norm,
                            int64_t heads, bf16* proj, float* rstd, bf16* out,
                            cudaStream_t stream) const;
  // The backward of ProjectHeads given d_out into s.d_h (= or += when
  // accumulate): the head norm's backward first (into s.d_attn, free by then;
  // head_norm_grad +=), then the projection's (dw, db +=).
  absl::Status ProjectHeadsBackward(const bf16* d_out, const bf16* x, const bf16* w,
                                    const bf16* head_norm, const bf16* proj, const float* rstd,
                                    int64_t heads, CudaBackwardScratch& s, bool accumulate,
                                    float* dw, float* db, float* head_norm_grad,
                                    cudaStream_t stream) const;
  // dx (= or += when accumulate) dy W; dw += dy^T x; db += column sums of dy.
  absl::Status LinearBackward(const bf16* dy, const bf16* x, const bf16* w, int64_t in, int64_t out,
                              bf16* dx, bool accumulate, float* dw, float* db,
                              cudaStream_t stream) const;
  absl::Status HeadForwardBlock(const HeadBlock& block, const HeadPointers& p,
                                CudaHeadScratch& scratch, cudaStream_t stream) const;
  absl::Status HeadBackwardBlock(const HeadBlock& block, bool first_block,
                                 const HeadPointers& p, CudaHeadScratch& scratch,
                                 cudaStream_t stream) const;

  ModelDims dims_;
  LayerOffsets offsets_;
  CudaLayerTables tables_;
  kernels::cuda::CublasLtGemm gemm_;
  kernels::cuda::AttentionImpl attention_impl_ = kernels::cuda::AttentionImpl::kOwnKernel;
  std::string attention_reason_;
  const int32_t* positions_ = nullptr;  // CudaLayerMathOptions::positions
  const int32_t* segments_ = nullptr;   // CudaLayerMathOptions::segments
  // The attention shape of every call: the dims' with this instance's segment ids.
  kernels::cuda::AttentionShape AttentionShapeOf() const;
  std::unique_ptr<kernels::cuda::CudnnAttention> cudnn_;  // set when attention_impl_ is kCudnn
};

}  // namespace megatrain::engine
