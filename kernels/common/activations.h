// SwiGLU (silu(gate) * up) forward and backward, per element, fp32 math.
#pragma once

#include <cmath>

#include "kernels/common/host_device.h"

namespace megatrain::kernels {

MT_HD float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

MT_HD float Silu(float x) { return x * Sigmoid(x); }

// y = silu(gate) * up.
MT_HD float SwigluForward(float gate, float up) { return Silu(gate) * up; }

// Given dy for y = silu(g) * u: du = silu(g) * dy; dg = u * dy * silu'(g),
// silu'(g) = s + g * s * (1 - s) with s = sigmoid(g).
MT_HD void SwigluBackward(float gate, float up, float dy, float* d_gate, float* d_up) {
  const float s = Sigmoid(gate);
  const float silu = gate * s;
  *d_up = silu * dy;
  *d_gate = up * dy * (s + gate * s * (1.0f - s));
}

}  // namespace megatrain::kernels
