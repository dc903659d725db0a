// bf16 GEMM through cuBLASLt (fp32 compute, bf16 or fp32 output) for row-major
// tensors, as a move-only handle owning the cublasLt handle, its workspace and
// the per-shape plans (gemm_plan.h: descriptors and algorithm built once per
// shape; the own fallback kernel where cuBLASLt has no algorithm). The three
// products a linear layer y = x W^T needs are named methods; Matmul is the
// general form.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/gemm_selection.h"

namespace megatrain::kernels::cuda {

enum class GemmOutput { kBf16, kFp32 };

// Row-major C[m, n] = alpha * op(A)[m, k] * op(B)[k, n] + beta * C, with
// op(X) = X or X^T. A and B are bf16; A is stored [m, k] (or [k, m] when
// transpose_a), B [k, n] (or [n, k] when transpose_b); all densely packed.
struct MatmulArgs {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  bool transpose_a = false;
  bool transpose_b = false;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  // Where beta * C is read from when it is not c itself (C != D: y = residual
  // + x W^T without copying the residual first); same type and shape as c,
  // may equal c. Null: c.
  const void* c_source = nullptr;
  GemmOutput c_type = GemmOutput::kBf16;
  float alpha = 1.0f;
  float beta = 0.0f;
};

class GemmPlanCache;

class CublasLtGemm {
 public:
  // 32 MiB: what cuBLAS recommends for Hopper; one fixed size so the chosen
  // algorithms (and so the results) never depend on a memory budget.
  static constexpr size_t kDefaultWorkspaceBytes = size_t{32} << 20;

  // Creates the cublasLt handle and cudaMallocs the workspace on the current
  // device. UNAVAILABLE when there is no usable GPU.
  static absl::StatusOr<CublasLtGemm> Create(size_t workspace_bytes = kDefaultWorkspaceBytes);

  CublasLtGemm(CublasLtGemm&& other) noexcept;
  CublasLtGemm& operator=(CublasLtGemm&& other) noexcept;
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;
  ~CublasLtGemm();

  // Frees the workspace and destroys the handle, reporting failures (the
  // destructor does the same silently). Idempotent.
  absl::Status Close();

  // Every shape runs: cuBLASLt when its heuristics offer an algorithm
  // (gemm_selection.h's ladder), else the own fallback kernel; k = 0 computes
  // C = beta * C. The plan of a (shape, output type, pointer alignments) is
  // built on its first call and reused.
  absl::Status Matmul(const MatmulArgs& args, cudaStream_t stream) const;

  // The path Matmul takes for `args` (its pointers' alignments count), building the plan.
  absl::StatusOr<GemmPath> PathFor(const MatmulArgs& args) const;
  // Matmul on the fallback kernel whatever cuBLASLt offers (for tests against cuBLASLt).
  absl::Status FallbackMatmul(const MatmulArgs& args, cudaStream_t stream) const;
  size_t cached_plans() const;

  // y[tokens, out] = x[tokens, in] * W[out, in]^T (bf16 y).
  absl::Status LinearForward(const void* x, const void* w, void* y, int64_t tokens, int64_t in,
                             int64_t out, cudaStream_t stream) const;

  // dx[tokens, in] (=, or += when accumulate) dy[tokens, out] * W[out, in] (bf16 dx).
  absl::Status LinearBackwardInput(const void* dy, const void* w, void* dx, int64_t tokens,
                                   int64_t in, int64_t out, bool accumulate,
                                   cudaStream_t stream) const;

  // dW[out, in] += dy[tokens, out]^T * x[tokens, in], dW fp32. K = tokens is
  // never split by us; cuBLASLt is restricted to algorithms without split-K
  // (or, where it has none, to split-K reduced through the workspace, never
  // in place), so the result is deterministic.
  absl::Status LinearBackwardWeight(const void* dy, const void* x, float* dw, int64_t tokens,
                                    int64_t in, int64_t out, cudaStream_t stream) const;

 private:
  CublasLtGemm(void* handle, void* workspace, size_t workspace_bytes);
  absl::Status CheckCall(const MatmulArgs& args, cudaStream_t stream) const;

  void* handle_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  // Behind a pointer so the handle moves; its plans die before the handle.
  std::unique_ptr<GemmPlanCache> plans_;
};

}  // namespace megatrain::kernels::cuda
