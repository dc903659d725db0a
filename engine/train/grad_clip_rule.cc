// The clip rules (see grad_clip_rule.h).
#include "engine/train/grad_clip_rule.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "engine/optimizer/grad_norm.h"

namespace megatrain::engine {

const char* GradClipRuleName(GradClipRule rule) {
  return rule == GradClipRule::kPreviousNorm ? "previous_norm" : "exact";
}

absl::StatusOr<GradClipRule> ParseGradClipRule(std::string_view name) {
  if (name == "exact") return GradClipRule::kExact;
  if (name == "previous_norm") return GradClipRule::kPreviousNorm;
  return absl::InvalidArgumentError(
      absl::StrCat("'", std::string(name), "' is not a clip rule (exact or previous_norm)"));
}

double PlannedClipCoefficient(GradClipRule rule, double grad_clip, double headroom,
                              double previous_norm) {
  if (rule != GradClipRule::kPreviousNorm || grad_clip <= 0 || !(previous_norm > 0) ||
      !GradNormIsFinite(previous_norm)) {
    return 0;
  }
  // A previous step that did not clip plans nothing: this one is likely not to clip either, and
  // a speculation with coefficient 1 commits then.
  if (ClipCoefficient(previous_norm, grad_clip) == 1.0) return 0;
  return ClipCoefficient(headroom * previous_norm, grad_clip);
}

double AppliedClipCoefficient(double grad_clip, double planned, double norm) {
  if (grad_clip <= 0) return 1.0;
  const double exact = ClipCoefficient(norm, grad_clip);
  if (planned > 0 && exact < 1.0 && planned * norm <= grad_clip) return planned;
  return exact;
}

double SpeculatedClipCoefficient(double planned) { return planned > 0 ? planned : 1.0; }

bool SpeculationCanCommit(double grad_clip, double planned, double lower_bound) {
  if (grad_clip <= 0 || !GradNormIsFinite(lower_bound)) return true;
  return planned > 0 ? planned * lower_bound <= grad_clip
                     : ClipCoefficient(lower_bound, grad_clip) == 1.0;
}

}  // namespace megatrain::engine
