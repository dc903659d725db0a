// SimdIsa: which vector instruction set the host optimizer kernels use,
// chosen at run time so the build itself stays x86-64-v3.
#pragma once

#include <string_view>

namespace megatrain::engine {

enum class SimdIsa {
  kScalar,  // plain C++ (the reference the vector bodies must match bit for bit)
  kAvx2,    // 8 floats per instruction; the build's baseline (x86-64-v3)
  kAvx512,  // 16 floats per instruction; only when the CPU reports avx512f
};

// True when this CPU can execute code for isa.
bool SimdIsaSupported(SimdIsa isa);

// The widest supported instruction set.
SimdIsa BestSupportedSimdIsa();

std::string_view SimdIsaName(SimdIsa isa);

}  // namespace megatrain::engine
