// Run-time CPU feature detection for SimdIsa.
#include "engine/optimizer/simd_isa.h"

namespace megatrain::engine {

bool SimdIsaSupported(SimdIsa isa) {
  switch (isa) {
    case SimdIsa::kScalar:
      return true;
    case SimdIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case SimdIsa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2");
  }
  return false;
}

SimdIsa BestSupportedSimdIsa() {
  if (SimdIsaSupported(SimdIsa::kAvx512)) return SimdIsa::kAvx512;
  if (SimdIsaSupported(SimdIsa::kAvx2)) return SimdIsa::kAvx2;
  return SimdIsa::kScalar;
}

std::string_view SimdIsaName(SimdIsa isa) {
  switch (isa) {
    case SimdIsa::kScalar:
      return "scalar";
    case SimdIsa::kAvx2:
      return "avx2";
    case SimdIsa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

}  // namespace megatrain::engine
