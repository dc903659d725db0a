// Rotary position embedding in the Hugging Face rotate-half convention:
// element i of a head pairs with element i + head_dim/2 (not i+1), and the
// frequency tables come from rope_theta with optional "llama3" scaling.
#pragma once

#include <cmath>

#include "kernels/common/host_device.h"

namespace megatrain::kernels {

// Forward rotation of the pair (x_lo, x_hi) = (x[i], x[i + half]) by angle
// with cos c and sin s:
//   out[i]        = x[i] * c - x[i + half] * s
//   out[i + half] = x[i + half] * c + x[i] * s
MT_HD void RopeRotate(float x_lo, float x_hi, float c, float s, float* out_lo, float* out_hi) {
  *out_lo = x_lo * c - x_hi * s;
  *out_hi = x_hi * c + x_lo * s;
}

// The backward of a rotation is the rotation by the negative angle.
MT_HD void RopeRotateBackward(float dy_lo, float dy_hi, float c, float s, float* dx_lo,
                              float* dx_hi) {
  *dx_lo = dy_lo * c + dy_hi * s;
  *dx_hi = dy_hi * c - dy_lo * s;
}

// Parameters of HF's `rope_scaling: {"rope_type": "llama3", ...}`; factor == 0
// means no scaling.
struct RopeScaling {
  double factor = 0.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192.0;
};

// Inverse frequency of pair index i (0 <= i < head_dim/2), computed in double
// on the host, as HF does: theta^(-2i/head_dim), then the llama3 warp.
inline double RopeInverseFrequency(int i, int head_dim, double theta, const RopeScaling& scaling) {
  const double inv_freq = 1.0 / std::pow(theta, (2.0 * i) / head_dim);
  if (scaling.factor == 0.0) return inv_freq;
  const double pi = 3.14159265358979323846;
  const double low_freq_wavelen =
      scaling.original_max_position_embeddings / scaling.low_freq_factor;
  const double high_freq_wavelen =
      scaling.original_max_position_embeddings / scaling.high_freq_factor;
  const double wavelen = 2.0 * pi / inv_freq;
  if (wavelen < high_freq_wavelen) return inv_freq;
  if (wavelen > low_freq_wavelen) return inv_freq / scaling.factor;
  const double smooth =
      (scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor) /
      (scaling.high_freq_factor - scaling.low_freq_factor);
  return (1.0 - smooth) * inv_freq / scaling.factor + smooth * inv_freq;
}

}  // namespace megatrain::kernels
