// Per-shape GEMM plans: a shape's cuBLASLt descriptors, layouts and chosen
// algorithm (or the fallback kernel), built once and reused by every call of
// that shape, so a training step makes no descriptor or heuristic calls after
// its first micro-batch. Internal to CublasLtGemm.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/gemm_mapping.h"
#include "kernels/cuda/gemm_selection.h"

namespace megatrain::kernels::cuda {

// Everything the choice of algorithm depends on. alpha and beta are not in
// it: they are passed to each call.
struct GemmPlanKey {
  GemmShape shape;
  bool c_fp32 = false;
  uint32_t align_lt_a = 16;
  uint32_t align_lt_b = 16;
  uint32_t align_c = 16;

  auto Tie() const {
    return std::tie(shape.m, shape.n, shape.k, shape.transpose_a, shape.transpose_b, c_fp32,
                    align_lt_a, align_lt_b, align_c);
  }
  bool operator<(const GemmPlanKey& other) const { return Tie() < other.Tie(); }
};

// One call's pointers and scalars: D = c, C = c_source (c when null).
struct GemmOperands {
  const void* a = nullptr;
  const void* b = nullptr;
  const void* c_source = nullptr;
  void* c = nullptr;
  float alpha = 1.0f;
  float beta = 0.0f;
  const void* c_in() const { return c_source != nullptr ? c_source : c; }
};

class GemmPlan {
 public:
  // Builds the descriptors and runs the selection ladder (gemm_selection.h).
  static absl::StatusOr<std::unique_ptr<GemmPlan>> Create(cublasLtHandle_t handle,
                                                          const GemmPlanKey& key,
                                                          uint64_t workspace_bytes);
  ~GemmPlan();
  GemmPlan(const GemmPlan&) = delete;
  GemmPlan& operator=(const GemmPlan&) = delete;

  GemmPath path() const { return path_; }

  // The own kernel on `key`'s shape, whatever cuBLASLt offers.
  static absl::Status RunFallback(const GemmPlanKey& key, const GemmOperands& ops,
                                  cudaStream_t stream);

  // cublasLtMatmul with the plan's algorithm; on the fallback path (or when
  // cuBLASLt refuses the algorithm at run time, NOT_SUPPORTED) the own kernel.
  absl::Status Run(cublasLtHandle_t handle, const GemmOperands& ops, void* workspace,
                   uint64_t workspace_bytes, cudaStream_t stream) const;

 private:
  explicit GemmPlan(const GemmPlanKey& key) : key_(key) {}

  const GemmPlanKey key_;
  GemmPath path_ = GemmPath::kFallbackKernel;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t layout_lt_a_ = nullptr;
  cublasLtMatrixLayout_t layout_lt_b_ = nullptr;
  cublasLtMatrixLayout_t layout_c_ = nullptr;
  cublasLtMatmulAlgo_t algo_ = {};
};

// Plans by key, created on first use; thread-safe. Past kMaxPlans distinct
// keys a plan is built for the call and dropped (shapes of a run are few: a
// layer's dozen plus the head's blocks, so this only bounds a pathological caller).
class GemmPlanCache {
 public:
  static constexpr size_t kMaxPlans = 4096;

  // Runs the key's plan, creating it first if needed.
  absl::Status Run(cublasLtHandle_t handle, const GemmPlanKey& key, const GemmOperands& ops,
                   void* workspace, uint64_t workspace_bytes, cudaStream_t stream);
  // The key's plan's path, creating it if needed (tests and diagnostics).
  absl::StatusOr<GemmPath> PathFor(cublasLtHandle_t handle, const GemmPlanKey& key,
                                   uint64_t workspace_bytes);
  size_t size() const;
  void Clear();  // before the handle goes

 private:
  absl::StatusOr<const GemmPlan*> Get(cublasLtHandle_t handle, const GemmPlanKey& key,
                                      uint64_t workspace_bytes,
                                      std::unique_ptr<GemmPlan>* uncached);

  mutable std::mutex mu_;
  std::map<GemmPlanKey, std::unique_ptr<GemmPlan>> plans_;
};

}  // namespace megatrain::kernels::cuda
