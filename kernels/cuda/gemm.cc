// cuBLASLt GEMM: row-major products computed as the column-major transposed
// product C^T = op(B)^T op(A)^T (gemm_mapping.h), which needs no data
// movement; per-shape plans (gemm_plan.h) hold the descriptors and algorithm.
#include "kernels/cuda/gemm.h"

#include <cublasLt.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/common/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/gemm_mapping.h"
#include "kernels/cuda/gemm_plan.h"

namespace megatrain::kernels::cuda {
namespace {

constexpr absl::string_view kOp = "CublasLtGemm::Matmul";

cublasLtHandle_t Handle(void* h) { return static_cast<cublasLtHandle_t>(h); }

absl::Status CheckMatmulArgs(const MatmulArgs& args) {
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

GemmPlanKey KeyOf(const MatmulArgs& args) {
  GemmPlanKey key;
  key.shape = GemmShape{args.m, args.n, args.k, args.transpose_a, args.transpose_b};
  key.c_fp32 = args.c_type == GemmOutput::kFp32;
  key.align_lt_a = PointerAlignment(args.b);  // cuBLASLt's "A" is our B
  key.align_lt_b = PointerAlignment(args.a);
  // C and D share one layout and one alignment preference: the smaller of the two pointers'.
  key.align_c = std::min(PointerAlignment(args.c),
                         PointerAlignment(args.c_source != nullptr ? args.c_source : args.c));
  return key;
}

GemmOperands OperandsOf(const MatmulArgs& args) {
  GemmOperands ops;
  ops.a = args.a;
  ops.b = args.b;
  ops.c_source = args.c_source;
  ops.c = args.c;
  ops.alpha = args.alpha;
  ops.beta = args.beta;
  return ops;
}

}  // namespace

CublasLtGemm::CublasLtGemm(void* handle, void* workspace, size_t workspace_bytes)
    : handle_(handle),
      workspace_(workspace),
      workspace_bytes_(workspace_bytes),
      plans_(std::make_unique<GemmPlanCache>()) {}

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
      workspace_bytes_(std::exchange(other.workspace_bytes_, 0)),
      plans_(std::move(other.plans_)) {}

CublasLtGemm& CublasLtGemm::operator=(CublasLtGemm&& other) noexcept {
  if (this != &other) {
    Close().IgnoreError();
    handle_ = std::exchange(other.handle_, nullptr);
    workspace_ = std::exchange(other.workspace_, nullptr);
    workspace_bytes_ = std::exchange(other.workspace_bytes_, 0);
    plans_ = std::move(other.plans_);
  }
  return *this;
}

CublasLtGemm::~CublasLtGemm() { Close().IgnoreError(); }

absl::Status CublasLtGemm::Close() {
  absl::Status status;
  if (plans_ != nullptr) plans_->Clear();  // descriptors before the handle
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

absl::Status CublasLtGemm::CheckCall(const MatmulArgs& args, cudaStream_t stream) const {
  if (handle_ == nullptr || plans_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(kOp, ": closed"));
  }
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": stream is a default stream"));
  }
  return CheckMatmulArgs(args);
}

absl::Status CublasLtGemm::Matmul(const MatmulArgs& args, cudaStream_t stream) const {
  MT_RETURN_IF_ERROR(CheckCall(args, stream));
  if (args.m == 0 || args.n == 0) return absl::OkStatus();
  MT_RETURN_IF_ERROR(plans_->Run(Handle(handle_), KeyOf(args), OperandsOf(args), workspace_,
                                 workspace_bytes_, stream));
  return CudaStatus(cudaGetLastError(), kOp);
}

absl::StatusOr<GemmPath> CublasLtGemm::PathFor(const MatmulArgs& args) const {
  if (handle_ == nullptr || plans_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(kOp, ": closed"));
  }
  MT_RETURN_IF_ERROR(CheckMatmulArgs(args));
  return plans_->PathFor(Handle(handle_), KeyOf(args), workspace_bytes_);
}

absl::Status CublasLtGemm::FallbackMatmul(const MatmulArgs& args, cudaStream_t stream) const {
  MT_RETURN_IF_ERROR(CheckCall(args, stream));
  if (args.m == 0 || args.n == 0) return absl::OkStatus();
  MT_RETURN_IF_ERROR(GemmPlan::RunFallback(KeyOf(args), OperandsOf(args), stream));
  return CudaStatus(cudaGetLastError(), kOp);
}

size_t CublasLtGemm::cached_plans() const { return plans_ == nullptr ? 0 : plans_->size(); }

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
