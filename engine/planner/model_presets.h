// Named model architectures for the planner (HF config.json equivalents): the Qwen2.5 and
// Qwen3 dense families, Llama shapes used by the published baselines, and a ~120B
// Qwen2-shaped model.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"

namespace megatrain::engine::planner {

std::vector<std::string> ModelPresetNames();

// NOT_FOUND listing the names.
absl::StatusOr<ModelConfig> ModelPreset(std::string_view name);

}  // namespace megatrain::engine::planner
