// Causal GQA attention on tensor cores through cuDNN 9's fused
// scaled-dot-product attention (graph API via the header-only
// cudnn-frontend): bf16 q/k/v/out, fp32 softmax statistics, deterministic
// backward. Same layouts and contract as AttentionForward/AttentionBackward
// in ops.h, so either implementation can serve a layer (attention_select.h
// decides; our kernel stays the checker and the fallback).
//
// 1. One cudnnHandle_t per CudnnAttention (CudnnHandle: RAII, move-only),
//    bound with cudnnSetStream to the stream of each call (re-bound only
//    when the stream changes); every execution is enqueued on that stream.
// 2. Prepare(shape, split) builds the forward and the backward graphs of a
//    shape once (heuristics mode A, then plans) and caches them by
//    (batch, q_heads, kv_heads, seq, head_dim, causal, scale); it returns the
//    two plans' workspace sizes. The backward may be cut into calls over
//    batch items and kv-head groups (pointer offsets into the same tensors,
//    the full tensors' strides) so its O(seq^2) workspace fits. Building needs the device and
//    may take tens of milliseconds: do it at set-up, never inside a step.
// 3. Forward/Backward look the graphs up (FailedPrecondition if Prepare was
//    not called) and execute them with the caller's workspace (at least the
//    bytes Prepare returned; it comes from the device arena like our
//    kernel's scratch).
// Tensors as cuDNN sees them (dims [b, h, s, d], strides of our
// [b, s, h, d] storage): q, out, dq: strides [s*hq*d, d, hq*d, 1]; k, v, dk,
// dv: [s*hk*d, d, hk*d, 1]; lse (cuDNN's "Stats", fp32 [b, hq, s, 1]): the
// natural-log log-sum-exp of the scaled scores per query row, the same
// quantity and layout as our kernel's lse. Even so a run never mixes them:
// the forward and the backward of a shape use one implementation.
// Built without the cudnn-frontend headers, every call returns Unimplemented.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/attention_select.h"
#include "kernels/cuda/ops.h"

struct cudnnContext;  // cudnnHandle_t is cudnnContext*

namespace megatrain::kernels::cuda {

// An owned cuDNN handle. Create fails cleanly (FailedPrecondition with
// cuDNN's message) where there is no usable device.
class CudnnHandle {
 public:
  static absl::StatusOr<CudnnHandle> Create();

  CudnnHandle() = default;
  ~CudnnHandle();
  CudnnHandle(CudnnHandle&& other) noexcept;
  CudnnHandle& operator=(CudnnHandle&& other) noexcept;
  CudnnHandle(const CudnnHandle&) = delete;
  CudnnHandle& operator=(const CudnnHandle&) = delete;

  cudnnContext* get() const { return handle_; }
  // cudnnSetStream when `stream` differs from the bound one.
  absl::Status BindStream(cudaStream_t stream);

 private:
  explicit CudnnHandle(cudnnContext* handle) : handle_(handle) {}
  cudnnContext* handle_ = nullptr;
  cudaStream_t bound_ = nullptr;
};

// The cuDNN library version at run time (cudnnGetVersion()).
int CudnnRuntimeVersion();

// Workspace bytes of a shape's two plans.
struct CudnnAttentionWorkspace {
  size_t forward = 0;
  size_t backward = 0;
};

class CudnnAttention {
 public:
  static absl::StatusOr<CudnnAttention> Create();

  CudnnAttention(CudnnAttention&&) noexcept;
  CudnnAttention& operator=(CudnnAttention&&) noexcept;
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;
  ~CudnnAttention();

  // Builds (or finds) the causal forward + deterministic backward graphs of
  // `shape` and returns their workspace bytes (the backward's: one call's).
  // `backward_split` (attention_select.h) cuts the backward into calls over
  // batch items and kv-head groups, run one after the other on the stream
  // with the same workspace; {0, 0} (the default) = one call; a split that
  // CheckCudnnBackwardSplit refuses is InvalidArgument. Preparing a
  // shape again with another split replaces its graphs. Unimplemented /
  // FailedPrecondition when cuDNN refuses the shape (then use our kernel).
  absl::StatusOr<CudnnAttentionWorkspace> Prepare(const AttentionShape& shape,
                                                  CudnnBackwardSplit backward_split = {});

  // As AttentionForward (ops.h); lse = cuDNN's Stats.
  absl::Status Forward(const AttentionShape& shape, const void* q, const void* k, const void* v,
                       void* out, float* lse, void* workspace, size_t workspace_bytes,
                       cudaStream_t stream);

  // As AttentionBackward (ops.h): dq, dk, dv written (not accumulated), from
  // the lse this class's Forward saved.
  absl::Status Backward(const AttentionShape& shape, const void* q, const void* k, const void* v,
                        const void* out, const void* dout, const float* lse, void* dq, void* dk,
                        void* dv, void* workspace, size_t workspace_bytes, cudaStream_t stream);

 private:
  struct Impl;
  explicit CudnnAttention(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace megatrain::kernels::cuda
