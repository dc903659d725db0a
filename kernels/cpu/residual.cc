// Residual connection y += x.
#include "kernels/cpu/residual.h"

namespace megatrain::kernels::cpu {

void ResidualAdd(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

}  // namespace megatrain::kernels::cpu
