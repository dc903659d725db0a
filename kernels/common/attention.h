// Scaled-dot-product attention element formulas (softmax over keys, with the
// row's log-sum-exp saved by the forward pass), shared by both backends:
//   P_ij = exp(S_ij - lse_i),  dS_ij = P_ij * (dP_ij - delta_i),
//   delta_i = sum_d dO_id * O_id.
#pragma once

#include <cmath>

#include "kernels/common/host_device.h"

namespace megatrain::kernels {

MT_HD float AttentionProbability(float score, float lse) { return expf(score - lse); }

MT_HD float AttentionScoreGrad(float probability, float d_probability, float delta) {
  return probability * (d_probability - delta);
}

}  // namespace megatrain::kernels
