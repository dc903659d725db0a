// How a GEMM's implementation is chosen, as host-only logic: the ladder of
// cuBLASLt preference sets tried in order, and the own fallback kernel when
// cuBLASLt offers no algorithm for any (odd shapes, 2-byte aligned rows).
// gemm_plan.cc asks cuBLASLt; gemm_selection_test drives the ladder with fakes.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"

namespace megatrain::kernels::cuda {

enum class GemmPath {
  kLtNoReduction,          // cuBLASLt, no split-K (the first choice)
  kLtDeterministicSplitK,  // cuBLASLt, split-K reduced through the workspace (no in-place atomics)
  kFallbackKernel,         // gemm_fallback.cu: one thread per output, fp32 accumulation in k order
};

// "cublaslt", "cublaslt_split_k", "fallback_kernel".
std::string_view GemmPathName(GemmPath path);

// The cuBLASLt matmul preference attributes of one attempt.
struct LtPreferences {
  uint32_t reduction_scheme_mask = 0;  // cublasLtReductionScheme_t bits; 0 = none allowed
  uint64_t max_workspace_bytes = 0;
  uint32_t align_lt_a = 16;  // bytes: cuBLASLt's "A" (our B)
  uint32_t align_lt_b = 16;  // cuBLASLt's "B" (our A)
  uint32_t align_c = 16;     // C and D
};

struct LtAttempt {
  GemmPath path;
  LtPreferences preferences;
};

// The cuBLASLt attempts in order. Every attempt states the pointers' true
// alignments (lowering them never adds algorithms) and keeps the result
// deterministic for a fixed algorithm: the relaxation allows split-K only with
// the workspace-reduced schemes (COMPUTE_TYPE, OUTPUT_TYPE), never INPLACE.
std::vector<LtAttempt> LtAttempts(uint32_t align_lt_a, uint32_t align_lt_b, uint32_t align_c,
                                  uint64_t workspace_bytes);

// The answer of one heuristic query: true when an algorithm was found, false
// when cuBLASLt has none for these preferences, an error when the query itself
// failed (the handle is broken, out of memory).
using FindAlgorithm = absl::FunctionRef<absl::StatusOr<bool>(const LtAttempt&)>;

// The first attempt `find` accepts, else kFallbackKernel. k = 0 (C = beta * C)
// goes straight to the fallback kernel: cuBLASLt rejects it.
absl::StatusOr<GemmPath> SelectGemmPath(int64_t k, const std::vector<LtAttempt>& attempts,
                                        FindAlgorithm find);

}  // namespace megatrain::kernels::cuda
