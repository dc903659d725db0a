// AdamW (decoupled weight decay) for one element, in the operation order of
// torch.optim.AdamW's single-tensor path. Per-step scalars are computed once
// on the host (AdamwStepScalars) so every backend applies the same formula.
#pragma once

#include <cmath>

#include "kernels/common/host_device.h"

namespace megatrain::kernels {

struct AdamwStepScalars {
  float lr = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;           // 0 for norms and biases
  float step_size = 0.0f;              // lr / (1 - beta1^t)
  float bias_correction2_sqrt = 1.0f;  // sqrt(1 - beta2^t)
  float grad_scale = 1.0f;             // global-norm clip coefficient (and 1/accumulation if any)
};

// Fills the derived fields for optimizer step t (1-based).
inline AdamwStepScalars MakeAdamwStepScalars(double lr, double beta1, double beta2, double eps,
                                             double weight_decay, long long step,
                                             double grad_scale) {
  AdamwStepScalars s;
  s.lr = static_cast<float>(lr);
  s.beta1 = static_cast<float>(beta1);
  s.beta2 = static_cast<float>(beta2);
  s.eps = static_cast<float>(eps);
  s.weight_decay = static_cast<float>(weight_decay);
  s.step_size = static_cast<float>(lr / (1.0 - std::pow(beta1, static_cast<double>(step))));
  s.bias_correction2_sqrt =
      static_cast<float>(std::sqrt(1.0 - std::pow(beta2, static_cast<double>(step))));
  s.grad_scale = static_cast<float>(grad_scale);
  return s;
}

// One element: p <- p * (1 - lr*wd); m <- b1 m + (1-b1) g; v <- b2 v + (1-b2) g^2;
// p <- p - step_size * m / (sqrt(v)/sqrt(bc2) + eps).
// Out of place: reads the element's current param, m and v by value and writes the new ones
// through the out pointers (the speculative update keeps the current state untouched and writes
// alternates); AdamwUpdate is this with the outputs on the inputs' own homes, so both forms are
// one formula and give the same bits.
MT_HD void AdamwUpdateTo(const AdamwStepScalars& s, float grad, float param, float m, float v,
                         float* param_out, float* m_out, float* v_out) {
  const float g = grad * s.grad_scale;
  float p = param * (1.0f - s.lr * s.weight_decay);
  const float m_new = s.beta1 * m + (1.0f - s.beta1) * g;
  const float v_new = s.beta2 * v + (1.0f - s.beta2) * (g * g);
  const float denom = sqrtf(v_new) / s.bias_correction2_sqrt + s.eps;
  p -= s.step_size * (m_new / denom);
  *param_out = p;
  *m_out = m_new;
  *v_out = v_new;
}

// In place.
MT_HD void AdamwUpdate(const AdamwStepScalars& s, float grad, float* param, float* m, float* v) {
  AdamwUpdateTo(s, grad, *param, *m, *v, param, m, v);
}

}  // namespace megatrain::kernels
