// Residual connection y += x (its backward is the identity on the gradient).
#pragma once

#include <cstdint>

namespace megatrain::kernels::cpu {

// y[i] += x[i] for i < n.
void ResidualAdd(const float* x, int64_t n, float* y);

}  // namespace megatrain::kernels::cpu
