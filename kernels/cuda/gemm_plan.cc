// GemmPlan: cuBLASLt descriptors from the pure mapping (gemm_mapping.h), the
// algorithm from the selection ladder (gemm_selection.h), the fallback kernel
// (gemm_fallback.cu) when cuBLASLt has none; GemmPlanCache keys them by shape.
#include "kernels/cuda/gemm_plan.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/gemm_fallback.h"

namespace megatrain::kernels::cuda {
namespace {

static_assert(CUBLASLT_REDUCTION_SCHEME_INPLACE == 1 &&
                  CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE == 2 &&
                  CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE == 4,
              "gemm_selection.cc repeats these values");

absl::Status MakeLayout(cudaDataType_t type, const ColumnMajorLayout& l,
                        cublasLtMatrixLayout_t* out) {
  return CublasStatus(cublasLtMatrixLayoutCreate(out, type, static_cast<uint64_t>(l.rows),
                                                 static_cast<uint64_t>(l.cols), l.ld),
                      "cublasLtMatrixLayoutCreate");
}

template <class T>
absl::Status SetPreference(cublasLtMatmulPreference_t pref,
                           cublasLtMatmulPreferenceAttributes_t attribute, const T& value,
                           const char* what) {
  return CublasStatus(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &value, sizeof(value)),
                      what);
}

struct PreferenceHandle {
  cublasLtMatmulPreference_t pref = nullptr;
  ~PreferenceHandle() {
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
  }
};

}  // namespace

GemmPlan::~GemmPlan() {
  if (layout_c_ != nullptr) cublasLtMatrixLayoutDestroy(layout_c_);
  if (layout_lt_b_ != nullptr) cublasLtMatrixLayoutDestroy(layout_lt_b_);
  if (layout_lt_a_ != nullptr) cublasLtMatrixLayoutDestroy(layout_lt_a_);
  if (desc_ != nullptr) cublasLtMatmulDescDestroy(desc_);
}

absl::StatusOr<std::unique_ptr<GemmPlan>> GemmPlan::Create(cublasLtHandle_t handle,
                                                           const GemmPlanKey& key,
                                                           uint64_t workspace_bytes) {
  std::unique_ptr<GemmPlan> plan(new GemmPlan(key));
  if (key.shape.k == 0 || key.shape.m == 0 || key.shape.n == 0) return plan;  // fallback kernel
  const CublasLtMapping map = MapRowMajorGemm(key.shape);
  const cudaDataType_t c_type = key.c_fp32 ? CUDA_R_32F : CUDA_R_16BF;
  MT_RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulDescCreate(&plan->desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                   "cublasLtMatmulDescCreate"));
  const cublasOperation_t op_a = map.transpose_lt_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = map.transpose_lt_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  MT_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmulDescSetAttribute(plan->desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)),
      "set TRANSA"));
  MT_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmulDescSetAttribute(plan->desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)),
      "set TRANSB"));
  MT_RETURN_IF_ERROR(MakeLayout(CUDA_R_16BF, map.lt_a, &plan->layout_lt_a_));
  MT_RETURN_IF_ERROR(MakeLayout(CUDA_R_16BF, map.lt_b, &plan->layout_lt_b_));
  MT_RETURN_IF_ERROR(MakeLayout(c_type, map.c, &plan->layout_c_));

  GemmPlan& p = *plan;
  auto find = [&](const LtAttempt& attempt) -> absl::StatusOr<bool> {
    PreferenceHandle h;
    MT_RETURN_IF_ERROR(
        CublasStatus(cublasLtMatmulPreferenceCreate(&h.pref), "cublasLtMatmulPreferenceCreate"));
    const LtPreferences& pr = attempt.preferences;
    MT_RETURN_IF_ERROR(SetPreference(h.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                     pr.max_workspace_bytes, "set MAX_WORKSPACE_BYTES"));
    MT_RETURN_IF_ERROR(SetPreference(h.pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                     pr.reduction_scheme_mask, "set REDUCTION_SCHEME_MASK"));
    MT_RETURN_IF_ERROR(SetPreference(h.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                     pr.align_lt_a, "set MIN_ALIGNMENT_A_BYTES"));
    MT_RETURN_IF_ERROR(SetPreference(h.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                     pr.align_lt_b, "set MIN_ALIGNMENT_B_BYTES"));
    MT_RETURN_IF_ERROR(SetPreference(h.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, pr.align_c,
                                     "set MIN_ALIGNMENT_C_BYTES"));
    MT_RETURN_IF_ERROR(SetPreference(h.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, pr.align_c,
                                     "set MIN_ALIGNMENT_D_BYTES"));
    cublasLtMatmulHeuristicResult_t result = {};
    int found = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(handle, p.desc_, p.layout_lt_a_, p.layout_lt_b_, p.layout_c_,
                                       p.layout_c_, h.pref, 1, &result, &found);
    // "No algorithm for this problem" comes back as NOT_SUPPORTED (or, for
    // layouts cuBLASLt rejects outright, INVALID_VALUE): a reason to try the
    // next rung, not an error.
    if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE) {
      return false;
    }
    MT_RETURN_IF_ERROR(CublasStatus(status, "cublasLtMatmulAlgoGetHeuristic"));
    if (found == 0 || result.state != CUBLAS_STATUS_SUCCESS) return false;
    p.algo_ = result.algo;
    return true;
  };
  const std::vector<LtAttempt> attempts =
      LtAttempts(key.align_lt_a, key.align_lt_b, key.align_c, workspace_bytes);
  absl::StatusOr<GemmPath> path = SelectGemmPath(key.shape.k, attempts, find);
  if (!path.ok()) return path.status();
  plan->path_ = *path;
  return plan;
}

absl::Status GemmPlan::RunFallback(const GemmPlanKey& key, const GemmOperands& ops,
                                   cudaStream_t stream) {
  FallbackGemmParams params;
  params.m = key.shape.m;
  params.n = key.shape.n;
  params.k = key.shape.k;
  params.transpose_a = key.shape.transpose_a;
  params.transpose_b = key.shape.transpose_b;
  params.a = static_cast<const uint16_t*>(ops.a);
  params.b = static_cast<const uint16_t*>(ops.b);
  params.c_source = ops.c_source;
  params.c = ops.c;
  params.c_fp32 = key.c_fp32;
  params.alpha = ops.alpha;
  params.beta = ops.beta;
  return CudaStatus(launch::FallbackGemm(params, stream), "fallback GEMM kernel");
}

absl::Status GemmPlan::Run(cublasLtHandle_t handle, const GemmOperands& ops, void* workspace,
                           uint64_t workspace_bytes, cudaStream_t stream) const {
  if (path_ == GemmPath::kFallbackKernel) return RunFallback(key_, ops, stream);
  // cuBLASLt's "A" is our B and its "B" our A (gemm_mapping.h); C and D share one layout.
  const cublasStatus_t status = cublasLtMatmul(
      handle, desc_, &ops.alpha, ops.b, layout_lt_a_, ops.a, layout_lt_b_, &ops.beta, ops.c_in(),
      layout_c_, ops.c, layout_c_, &algo_, workspace, workspace_bytes, stream);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) {
    // The heuristic's algorithm refused at launch (nothing was enqueued): run the own kernel.
    return RunFallback(key_, ops, stream);
  }
  return CublasStatus(status, "cublasLtMatmul");
}

absl::StatusOr<const GemmPlan*> GemmPlanCache::Get(cublasLtHandle_t handle, const GemmPlanKey& key,
                                                   uint64_t workspace_bytes,
                                                   std::unique_ptr<GemmPlan>* uncached) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();
  }
  // Built outside the lock (heuristic queries take tens of microseconds); a
  // racing builder of the same key loses and its plan is dropped.
  absl::StatusOr<std::unique_ptr<GemmPlan>> plan = GemmPlan::Create(handle, key, workspace_bytes);
  if (!plan.ok()) return plan.status();
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();
  if (plans_.size() >= kMaxPlans) {
    *uncached = *std::move(plan);
    return uncached->get();
  }
  const GemmPlan* raw = plan->get();
  plans_.emplace(key, *std::move(plan));
  return raw;
}

absl::Status GemmPlanCache::Run(cublasLtHandle_t handle, const GemmPlanKey& key,
                                const GemmOperands& ops, void* workspace, uint64_t workspace_bytes,
                                cudaStream_t stream) {
  std::unique_ptr<GemmPlan> uncached;
  absl::StatusOr<const GemmPlan*> plan = Get(handle, key, workspace_bytes, &uncached);
  if (!plan.ok()) return plan.status();
  return (*plan)->Run(handle, ops, workspace, workspace_bytes, stream);
}

absl::StatusOr<GemmPath> GemmPlanCache::PathFor(cublasLtHandle_t handle, const GemmPlanKey& key,
                                                uint64_t workspace_bytes) {
  std::unique_ptr<GemmPlan> uncached;
  absl::StatusOr<const GemmPlan*> plan = Get(handle, key, workspace_bytes, &uncached);
  if (!plan.ok()) return plan.status();
  return (*plan)->path();
}

size_t GemmPlanCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return plans_.size();
}

void GemmPlanCache::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  plans_.clear();
}

}  // namespace megatrain::kernels::cuda
