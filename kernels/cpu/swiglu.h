// SwiGLU gate of the MLP, out = silu(gate) * up, element-wise (kernels/common/activations.h).
#pragma once

#include <cstdint>

namespace megatrain::kernels::cpu {

// out[i] = silu(gate[i]) * up[i] for i < n (n = tokens * ffn). Overwrites out.
void SwigluForward(const float* gate, const float* up, int64_t n, float* out);

// Gradients for SwigluForward given dout; OVERWRITES dgate and dup.
void SwigluBackward(const float* gate, const float* up, const float* dout, int64_t n, float* dgate,
                    float* dup);

}  // namespace megatrain::kernels::cpu
