// The GEMM path ladder: cuBLASLt without split-K, cuBLASLt with workspace
// split-K, then the own fallback kernel.
#include "kernels/cuda/gemm_selection.h"

namespace megatrain::kernels::cuda {
namespace {

// cublasLtReductionScheme_t values (cublasLt.h), repeated so this file needs no CUDA headers;
// gemm_plan.cc static_asserts they match.
constexpr uint32_t kReductionComputeType = 2;
constexpr uint32_t kReductionOutputType = 4;

}  // namespace

std::string_view GemmPathName(GemmPath path) {
  switch (path) {
    case GemmPath::kLtNoReduction:
      return "cublaslt";
    case GemmPath::kLtDeterministicSplitK:
      return "cublaslt_split_k";
    case GemmPath::kFallbackKernel:
      return "fallback_kernel";
  }
  return "unknown";
}

std::vector<LtAttempt> LtAttempts(uint32_t align_lt_a, uint32_t align_lt_b, uint32_t align_c,
                                  uint64_t workspace_bytes) {
  LtPreferences strict;
  strict.reduction_scheme_mask = 0;
  strict.max_workspace_bytes = workspace_bytes;
  strict.align_lt_a = align_lt_a;
  strict.align_lt_b = align_lt_b;
  strict.align_c = align_c;
  std::vector<LtAttempt> attempts = {{GemmPath::kLtNoReduction, strict}};
  if (workspace_bytes > 0) {  // the workspace schemes need one
    LtPreferences split = strict;
    split.reduction_scheme_mask = kReductionComputeType | kReductionOutputType;
    attempts.push_back({GemmPath::kLtDeterministicSplitK, split});
  }
  return attempts;
}

absl::StatusOr<GemmPath> SelectGemmPath(int64_t k, const std::vector<LtAttempt>& attempts,
                                        FindAlgorithm find) {
  if (k == 0) return GemmPath::kFallbackKernel;
  for (const LtAttempt& attempt : attempts) {
    absl::StatusOr<bool> found = find(attempt);
    if (!found.ok()) return found.status();
    if (*found) return attempt.path;
  }
  return GemmPath::kFallbackKernel;
}

}  // namespace megatrain::kernels::cuda
