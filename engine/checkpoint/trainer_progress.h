// TrainerProgress: the optimizer's position, saved with a checkpoint and restored on resume.
#pragma once

#include <cstdint>

namespace megatrain::engine {

struct TrainerProgress {
  uint64_t step = 0;             // optimizer steps attempted (the LR schedule's position)
  uint64_t applied_updates = 0;  // steps whose AdamW update ran (AdamW's t)
  uint64_t skipped_steps = 0;    // non-finite steps skipped so far
  int consecutive_skips = 0;
  // The global gradient norm of the last step that updated (0 = none, or a run under the exact
  // rule): the previous-norm clip rule (TrainerOptions::grad_clip_rule) plans the next step's
  // coefficient from it.
  double previous_grad_norm = 0;
};

}  // namespace megatrain::engine
