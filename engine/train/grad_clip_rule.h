// How a step's global-norm clip coefficient is chosen (TrainerOptions::grad_clip_rule;
// docs/operations.md "Clip rules").
//
// kExact: min(1, grad_clip / (norm + 1e-6)) of the step's own global norm, as
// torch.nn.utils.clip_grad_norm_. Every gradient of the step is needed before any update, so
// the optimizer pass cannot start during the backward once a step clips.
//
// kPreviousNorm: after a step that clipped, the coefficient p of headroom x its norm is planned
// for the next step, before any of its gradients exists. The next step applies p when it clips
// too and p keeps the applied gradient within the clip (p x norm <= grad_clip); otherwise the
// exact coefficient. So exact clipping's bound on the applied gradient's norm holds on every
// step, and a step whose norm is under the clip is never clipped. The price: a clipped step whose
// norm is below headroom x the previous one is clipped by p, up to headroom x (previous norm /
// own norm) harder than exact clipping would. What it buys: with speculative_update the update
// with p runs during the backward and commits whenever p is applied, clipped steps included.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"

namespace megatrain::engine {

enum class GradClipRule { kExact, kPreviousNorm };
inline constexpr double kDefaultGradClipHeadroom = 1.25;

// "exact" or "previous_norm".
const char* GradClipRuleName(GradClipRule rule);
// INVALID_ARGUMENT naming the value for anything else.
absl::StatusOr<GradClipRule> ParseGradClipRule(std::string_view name);

// The coefficient the rule plans before a step, 0 when it plans none (kExact, clipping off, no
// previous norm yet (previous_norm 0), or a previous step that did not clip).
double PlannedClipCoefficient(GradClipRule rule, double grad_clip, double headroom,
                              double previous_norm);

// The coefficient the step's update uses, its finite global norm known: `planned` (from
// PlannedClipCoefficient) when it is not 0, the step clips (its exact coefficient is below 1)
// and planned x norm <= grad_clip; else the exact one (1 with clipping off).
double AppliedClipCoefficient(double grad_clip, double planned, double norm);

// The coefficient a speculative update runs with: the plan, else 1. It commits exactly when
// the step's applied coefficient equals it.
double SpeculatedClipCoefficient(double planned);

// False once the norm of the gradients final so far (`lower_bound`: the step's norm can only be
// larger) shows the speculation cannot commit: without a plan the step clips; with one,
// planned x lower_bound passes the clip. A non-finite bound says nothing.
bool SpeculationCanCommit(double grad_clip, double planned, double lower_bound);

}  // namespace megatrain::engine
