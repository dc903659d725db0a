// Cross-entropy of one logits row, element by element, given the row's
// log-sum-exp (from OnlineSoftmax): loss = lse - logit[target] and
// dlogit_j = (softmax_j - [j == target]) * scale. Shared by both backends.
#pragma once

#include <cmath>

#include "kernels/common/host_device.h"

namespace megatrain::kernels {

MT_HD float CrossEntropyRowLoss(float lse, float target_logit) { return lse - target_logit; }

MT_HD float CrossEntropyLogitGrad(float logit, float lse, bool is_target, float scale) {
  return (expf(logit - lse) - (is_target ? 1.0f : 0.0f)) * scale;
}

}  // namespace megatrain::kernels
