// Online (streaming) softmax state, used by tiled attention and the chunked
// cross-entropy: a running max and a running sum of exp(x - max), merged one
// value or one tile at a time so the full row never has to exist.
#pragma once

#include <cmath>

#include "kernels/common/host_device.h"

namespace megatrain::kernels {

struct OnlineSoftmax {
  float max = -INFINITY;
  float sum = 0.0f;  // sum of exp(x - max)
};

// Folds a tile whose own max is tile_max and whose sum of exp(x - tile_max)
// is tile_sum into state; returns the factor by which earlier accumulators
// (e.g. attention's output row) must be rescaled.
MT_HD float OnlineSoftmaxMerge(OnlineSoftmax* state, float tile_max, float tile_sum) {
  const float new_max = fmaxf(state->max, tile_max);
  const float old_scale = (state->max == -INFINITY) ? 0.0f : expf(state->max - new_max);
  const float tile_scale = (tile_max == -INFINITY) ? 0.0f : expf(tile_max - new_max);
  state->sum = state->sum * old_scale + tile_sum * tile_scale;
  state->max = new_max;
  return old_scale;
}

// log(sum(exp(x))) of everything merged so far.
MT_HD float OnlineSoftmaxLogSumExp(const OnlineSoftmax& state) {
  return state.max + logf(state.sum);
}

}  // namespace megatrain::kernels
