// Which kernel set OpenBLAS runs in this process, and a warning when it fell back to a pre-AVX2
// set on a CPU that has AVX2 and FMA (Debian's OpenBLAS 0.3.21 does not recognise some newer or
// virtualised CPUs: CPU-device training then runs 2.5-4x slower, docs/operations.md "OpenBLAS
// kernels"). OpenBLAS picks its kernels when it is loaded, so the remedy is OPENBLAS_CORETYPE in
// the environment (scripts/blas-core prints it; scripts/install puts it in the systemd unit).
#pragma once

#include <string>

namespace megatrain::kernels::cpu {

// OpenBLAS's name for its kernel set, e.g. "Haswell", "SkylakeX", "Prescott".
std::string OpenBlasCoreName();

// The kernel set OpenBLAS should use on this CPU when it runs a pre-AVX2 set here
// ("SkylakeX" with AVX-512 F/BW/DQ/VL, else "Haswell" with AVX2 and FMA); empty when its own
// choice is right.
std::string BetterOpenBlasCore(const std::string& core_name);

// Empty, or one line saying OpenBLAS runs its `core` kernels on a CPU that has better ones, and
// which OPENBLAS_CORETYPE to set.
std::string SlowBlasKernelsWarning();

}  // namespace megatrain::kernels::cpu
