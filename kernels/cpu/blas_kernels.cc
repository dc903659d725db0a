// OpenBLAS's kernel set and the warning for a slow fallback (see blas_kernels.h).
#include "kernels/cpu/blas_kernels.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <string_view>

extern "C" char* openblas_get_corename(void);

namespace megatrain::kernels::cpu {

std::string OpenBlasCoreName() {
  const char* name = openblas_get_corename();
  return name != nullptr ? std::string(name) : std::string();
}

std::string BetterOpenBlasCore(const std::string& core_name) {
  std::string lower = core_name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  // OpenBLAS's x86-64 sets older than AVX2 (its fallbacks for a CPU it does not know).
  constexpr std::array<std::string_view, 11> kPreAvx2 = {
      "prescott",   "katmai",  "coppermine", "northwood", "core2",      "penryn",
      "dunnington", "nehalem", "atom",       "banias",    "sandybridge"};
  if (std::find(kPreAvx2.begin(), kPreAvx2.end(), lower) == kPreAvx2.end()) return "";
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    return "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return "";
}

std::string SlowBlasKernelsWarning() {
  const std::string core = OpenBlasCoreName();
  const std::string better = BetterOpenBlasCore(core);
  if (better.empty()) return "";
  return "OpenBLAS runs its " + core + " kernels, made for CPUs without AVX2, on a CPU with " +
         (better == "SkylakeX" ? "AVX-512" : "AVX2") +
         " (it does not recognise this model): CPU-device training is several times slower. "
         "Set OPENBLAS_CORETYPE=" +
         better +
         " in the environment (scripts/blas-core; docs/operations.md \"OpenBLAS kernels\")";
}

}  // namespace megatrain::kernels::cpu
