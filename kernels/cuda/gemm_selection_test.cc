// The GEMM path ladder with fake heuristics: first acceptance wins, no
// algorithm anywhere falls back to the own kernel, query errors propagate,
// and no attempt allows a non-deterministic reduction; runs on the CPU.
#include "kernels/cuda/gemm_selection.h"

#include <gtest/gtest.h>

#include <vector>

#include "absl/status/status.h"

namespace megatrain::kernels::cuda {
namespace {

constexpr uint32_t kInPlace = 1;  // CUBLASLT_REDUCTION_SCHEME_INPLACE

TEST(GemmSelectionTest, FirstAttemptWhenCublasLtHasAnAlgorithm) {
  const auto attempts = LtAttempts(16, 16, 16, 1 << 20);
  int asked = 0;
  auto path = SelectGemmPath(64, attempts, [&](const LtAttempt&) -> absl::StatusOr<bool> {
    ++asked;
    return true;
  });
  ASSERT_TRUE(path.ok());
  EXPECT_EQ(*path, GemmPath::kLtNoReduction);
  EXPECT_EQ(asked, 1);
}

TEST(GemmSelectionTest, SplitKWhenOnlyTheRelaxedAttemptFinds) {
  const auto attempts = LtAttempts(2, 2, 2, 1 << 20);
  auto path = SelectGemmPath(99, attempts, [](const LtAttempt& a) -> absl::StatusOr<bool> {
    return a.preferences.reduction_scheme_mask != 0;
  });
  ASSERT_TRUE(path.ok());
  EXPECT_EQ(*path, GemmPath::kLtDeterministicSplitK);
}

TEST(GemmSelectionTest, OddShapesWithNoAlgorithmRunOnTheFallbackKernel) {
  const auto attempts = LtAttempts(2, 2, 2, 1 << 20);
  std::vector<GemmPath> tried;
  auto path = SelectGemmPath(99, attempts, [&](const LtAttempt& a) -> absl::StatusOr<bool> {
    tried.push_back(a.path);
    return false;
  });
  ASSERT_TRUE(path.ok());
  EXPECT_EQ(*path, GemmPath::kFallbackKernel);
  EXPECT_EQ(tried,
            (std::vector<GemmPath>{GemmPath::kLtNoReduction, GemmPath::kLtDeterministicSplitK}));
}

TEST(GemmSelectionTest, KZeroSkipsCublasLt) {
  auto path =
      SelectGemmPath(0, LtAttempts(16, 16, 16, 0), [](const LtAttempt&) -> absl::StatusOr<bool> {
        ADD_FAILURE() << "cuBLASLt asked for k = 0";
        return true;
      });
  ASSERT_TRUE(path.ok());
  EXPECT_EQ(*path, GemmPath::kFallbackKernel);
}

TEST(GemmSelectionTest, QueryErrorsPropagate) {
  auto path =
      SelectGemmPath(8, LtAttempts(16, 16, 16, 0), [](const LtAttempt&) -> absl::StatusOr<bool> {
        return absl::InternalError("handle broken");
      });
  EXPECT_EQ(path.status().code(), absl::StatusCode::kInternal);
}

TEST(GemmSelectionTest, AttemptsStateTrueAlignmentsAndStayDeterministic) {
  const auto attempts = LtAttempts(2, 8, 4, 32 << 20);
  ASSERT_EQ(attempts.size(), 2u);
  EXPECT_EQ(attempts[0].preferences.reduction_scheme_mask, 0u);
  for (const LtAttempt& a : attempts) {
    EXPECT_EQ(a.preferences.align_lt_a, 2u);
    EXPECT_EQ(a.preferences.align_lt_b, 8u);
    EXPECT_EQ(a.preferences.align_c, 4u);
    EXPECT_EQ(a.preferences.max_workspace_bytes, uint64_t{32} << 20);
    EXPECT_EQ(a.preferences.reduction_scheme_mask & kInPlace, 0u) << GemmPathName(a.path);
  }
  // Without a workspace there is no split-K attempt.
  EXPECT_EQ(LtAttempts(16, 16, 16, 0).size(), 1u);
}

}  // namespace
}  // namespace megatrain::kernels::cuda
