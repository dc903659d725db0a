// The OpenBLAS kernel-set check: only pre-AVX2 sets are questioned, and the suggestion
// follows this CPU's features.
#include "kernels/cpu/blas_kernels.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace megatrain::kernels::cpu {
namespace {

TEST(BlasKernelsTest, OpenBlasNamesItsKernels) { EXPECT_FALSE(OpenBlasCoreName().empty()); }

TEST(BlasKernelsTest, OnlyPreAvxFallbacksHaveABetterSet) {
  for (const char* own_choice : {"Haswell", "SkylakeX", "Zen", "Cooperlake", ""}) {
    EXPECT_EQ(BetterOpenBlasCore(own_choice), "") << own_choice;
  }
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const std::string expected = avx512 ? "SkylakeX" : avx2 ? "Haswell" : "";
  EXPECT_EQ(BetterOpenBlasCore("Prescott"), expected);
  EXPECT_EQ(BetterOpenBlasCore("CORE2"), expected);
  EXPECT_EQ(BetterOpenBlasCore("Sandybridge"), expected);
}

// The warning names the running set and the remedy exactly when there is a better one; with
// scripts/test's OPENBLAS_CORETYPE there is none.
TEST(BlasKernelsTest, WarningMatchesTheRunningSet) {
  const std::string better = BetterOpenBlasCore(OpenBlasCoreName());
  const std::string warning = SlowBlasKernelsWarning();
  if (better.empty()) {
    EXPECT_EQ(warning, "");
  } else {
    EXPECT_NE(warning.find("OPENBLAS_CORETYPE=" + better), std::string::npos) << warning;
    EXPECT_NE(warning.find(OpenBlasCoreName()), std::string::npos) << warning;
  }
}

}  // namespace
}  // namespace megatrain::kernels::cpu
