// SwiGLU gate of the MLP, out = silu(gate) * up, element-wise.
#include "kernels/cpu/swiglu.h"

#include "kernels/common/activations.h"

namespace megatrain::kernels::cpu {

void SwigluForward(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = kernels::SwigluForward(gate[i], up[i]);
}

void SwigluBackward(const float* gate, const float* up, const float* dout, int64_t n, float* dgate,
                    float* dup) {
  for (int64_t i = 0; i < n; ++i) {
    kernels::SwigluBackward(gate[i], up[i], dout[i], &dgate[i], &dup[i]);
  }
}

}  // namespace megatrain::kernels::cpu
