// cuBLASLt GEMM: row-major products computed as the column-major transposed
// product C^T = op(B)^T op(A)^T, which needs no data movement.
#include "kernels/cuda/gemm.h"

#include <cublasLt.h>

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/common/status_macros.h"
#include "kernels/cuda/cuda_status.h"

namespace megatrain::kernels::cuda {
namespace {

cublasLtHandle_t Handle(void* h) { return static_cast<cublasLtHandle_t>(h); }

struct MatmulDescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* d) const { cublasLtMatmulDescDestroy(d); }
};
struct LayoutDeleter {
  void operator()(cublasLtMatrixLayoutOpaque_t* d) const { cublasLtMatrixLayoutDestroy(d); }
};
struct PreferenceDeleter {
  void operator()(cublasLtMatmulPreferenceOpaque_t* d) const { cublasLtMatmulPreferenceDestroy(d); }
};
using MatmulDesc = std::unique_ptr<cublasLtMatmulDescOpaque_t, MatmulDescDeleter>;
using Layout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LayoutDeleter>;
using Preference = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, PreferenceDeleter>;

absl::Status MakeLayout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, Layout* out) {
  cublasLtMatrixLayout_t layout = nullptr;
  MT_RETURN_IF_ERROR(
      CublasStatus(cublasLtMatrixLayoutCreate(&layout, type, static_cast<uint64_t>(rows),
                                              static_cast<uint64_t>(cols), ld),
                   "cublasLtMatrixLayoutCreate"));
  out->reset(layout);
  return absl::OkStatus();
}

// Largest power of two (<= 16) dividing the address: what cuBLASLt may
// assume about the pointer when picking a kernel. Capped at 16 bytes (all a
// Hopper tensor-core kernel needs) so the kernel chosen, and with it the
// bits of the result, do not depend on where a tensor sits in a slot, the
// ring or a vocabulary block.
uint32_t Alignment(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 16;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

absl::Status CheckMatmulArgs(const MatmulArgs& args) {
  constexpr absl::string_view kOp = "CublasLtGemm::Matmul";
  if (args.m < 0 || args.n < 0 || args.k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": m, n, k = ", args.m, ", ", args.n, ", ", args.k, " must be >= 0"));
  }
  if (args.m > 0 && args.n > 0 && args.k > 0 && (args.a == nullptr || args.b == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": a or b is null"));
  }
  if (args.m > 0 && args.n > 0 && args.c == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": c is null"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CublasLtGemm> CublasLtGemm::Create(size_t workspace_bytes) {
  cublasLtHandle_t handle = nullptr;
  MT_RETURN_IF_ERROR(CublasStatus(cublasLtCreate(&handle), "cublasLtCreate"));
  void* workspace = nullptr;
  if (workspace_bytes > 0) {
    const cudaError_t err = cudaMalloc(&workspace, workspace_bytes);
    if (err != cudaSuccess) {
      cublasLtDestroy(handle);
      return CudaStatus(err, absl::StrCat("cudaMalloc(", workspace_bytes, " B gemm workspace)"));
    }
  }
  return CublasLtGemm(handle, workspace, workspace_bytes);
}

CublasLtGemm::CublasLtGemm(CublasLtGemm&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)),
      workspace_(std::exchange(other.workspace_, nullptr)),
      workspace_bytes_(std::exchange(other.workspace_bytes_, 0)) {}

CublasLtGemm& CublasLtGemm::operator=(CublasLtGemm&& other) noexcept {
  if (this != &other) {
    Close().IgnoreError();
    handle_ = std::exchange(other.handle_, nullptr);
    workspace_ = std::exchange(other.workspace_, nullptr);
    workspace_bytes_ = std::exchange(other.workspace_bytes_, 0);
  }
  return *this;
}

CublasLtGemm::~CublasLtGemm() { Close().IgnoreError(); }

absl::Status CublasLtGemm::Close() {
  absl::Status status;
  if (workspace_ != nullptr) {
    status.Update(CudaStatus(cudaFree(workspace_), "cudaFree(gemm workspace)"));
    workspace_ = nullptr;
    workspace_bytes_ = 0;
  }
  if (handle_ != nullptr) {
    status.Update(CublasStatus(cublasLtDestroy(Handle(handle_)), "cublasLtDestroy"));
    handle_ = nullptr;
  }
  return status;
}

absl::Status CublasLtGemm::Matmul(const MatmulArgs& args, cudaStream_t stream) const {
  constexpr absl::string_view kOp = "CublasLtGemm::Matmul";
  if (handle_ == nullptr) return absl::FailedPreconditionError(absl::StrCat(kOp, ": closed"));
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": stream is a default stream"));
  }
  MT_RETURN_IF_ERROR(CheckMatmulArgs(args));
  if (args.m == 0 || args.n == 0) return absl::OkStatus();
  if (args.k == 0) {
    return absl::UnimplementedError(absl::StrCat(kOp, ": k = 0 (C = beta * C) is not supported"));
  }

  const cudaDataType_t c_type = args.c_type == GemmOutput::kBf16 ? CUDA_R_16BF : CUDA_R_32F;
  // Column-major view: C^T[n, m] = op(B)^T[n, k] * op(A)^T[k, m], so cuBLAS's
  // "A" is our B and its "B" is our A, each with its own transpose flag.
  const cublasOperation_t op_b = args.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = args.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;

  cublasLtMatmulDesc_t raw_desc = nullptr;
  MT_RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulDescCreate(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                   "cublasLtMatmulDescCreate"));
  MatmulDesc desc(raw_desc);
  MT_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof(op_b)),
      "set TRANSA"));
  MT_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof(op_a)),
      "set TRANSB"));

  // Stored shapes in column-major terms (rows, cols, leading dimension).
  Layout layout_b;  // cuBLAS "A": our B
  if (args.transpose_b) {
    MT_RETURN_IF_ERROR(MakeLayout(CUDA_R_16BF, args.k, args.n, args.k, &layout_b));
  } else {
    MT_RETURN_IF_ERROR(MakeLayout(CUDA_R_16BF, args.n, args.k, args.n, &layout_b));
  }
  Layout layout_a;  // cuBLAS "B": our A
  if (args.transpose_a) {
    MT_RETURN_IF_ERROR(MakeLayout(CUDA_R_16BF, args.m, args.k, args.m, &layout_a));
  } else {
    MT_RETURN_IF_ERROR(MakeLayout(CUDA_R_16BF, args.k, args.m, args.k, &layout_a));
  }
  Layout layout_c;
  MT_RETURN_IF_ERROR(MakeLayout(c_type, args.n, args.m, args.n, &layout_c));

  cublasLtMatmulPreference_t raw_pref = nullptr;
  MT_RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulPreferenceCreate(&raw_pref), "cublasLtMatmulPreferenceCreate"));
  Preference pref(raw_pref);
  const uint64_t workspace_bytes = workspace_bytes_;
  MT_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &workspace_bytes, sizeof(workspace_bytes)),
      "set MAX_WORKSPACE_BYTES"));
  // Determinism: no split-K reduction schemes.
  const uint32_t reduction_mask = CUBLASLT_REDUCTION_SCHEME_NONE;
  MT_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                           &reduction_mask, sizeof(reduction_mask)),
      "set REDUCTION_SCHEME_MASK"));
  const uint32_t align_a = Alignment(args.b);  // cuBLAS "A"
  const uint32_t align_b = Alignment(args.a);
  const uint32_t align_c = Alignment(args.c);
  MT_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                           &align_a, sizeof(align_a)),
      "set MIN_ALIGNMENT_A_BYTES"));
  MT_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                           &align_b, sizeof(align_b)),
      "set MIN_ALIGNMENT_B_BYTES"));
  MT_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                           &align_c, sizeof(align_c)),
      "set MIN_ALIGNMENT_C_BYTES"));
  MT_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                           &align_c, sizeof(align_c)),
      "set MIN_ALIGNMENT_D_BYTES"));

  cublasLtMatmulHeuristicResult_t heuristic = {};
  int found = 0;
  MT_RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulAlgoGetHeuristic(Handle(handle_), desc.get(), layout_b.get(),
                                                  layout_a.get(), layout_c.get(), layout_c.get(),
                                                  pref.get(), 1, &heuristic, &found),
                   "cublasLtMatmulAlgoGetHeuristic"));
  if (found == 0) {
    return absl::UnimplementedError(absl::StrCat(
        kOp, ": no cuBLASLt algorithm for m, n, k = ", args.m, ", ", args.n, ", ", args.k));
  }
  MT_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmul(Handle(handle_), desc.get(), &args.alpha, args.b, layout_b.get(), args.a,
                     layout_a.get(), &args.beta, args.c, layout_c.get(), args.c, layout_c.get(),
                     &heuristic.algo, workspace_, workspace_bytes_, stream),
      "cublasLtMatmul"));
  return CudaStatus(cudaGetLastError(), kOp);
}

absl::Status CublasLtGemm::LinearForward(const void* x, const void* w, void* y, int64_t tokens,
                                         int64_t in, int64_t out, cudaStream_t stream) const {
  MatmulArgs args;
  args.m = tokens;
  args.n = out;
  args.k = in;
  args.a = x;
  args.b = w;
  args.transpose_b = true;
  args.c = y;
  args.c_type = GemmOutput::kBf16;
  return Matmul(args, stream);
}

absl::Status CublasLtGemm::LinearBackwardInput(const void* dy, const void* w, void* dx,
                                               int64_t tokens, int64_t in, int64_t out,
                                               bool accumulate, cudaStream_t stream) const {
  MatmulArgs args;
  args.m = tokens;
  args.n = in;
  args.k = out;
  args.a = dy;
  args.b = w;
  args.c = dx;
  args.c_type = GemmOutput::kBf16;
  args.beta = accumulate ? 1.0f : 0.0f;
  return Matmul(args, stream);
}

absl::Status CublasLtGemm::LinearBackwardWeight(const void* dy, const void* x, float* dw,
                                                int64_t tokens, int64_t in, int64_t out,
                                                cudaStream_t stream) const {
  MatmulArgs args;
  args.m = out;
  args.n = in;
  args.k = tokens;
  args.a = dy;
  args.transpose_a = true;
  args.b = x;
  args.c = dw;
  args.c_type = GemmOutput::kFp32;
  args.beta = 1.0f;
  return Matmul(args, stream);
}

}  // namespace megatrain::kernels::cuda
