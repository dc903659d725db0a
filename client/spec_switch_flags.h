// The spellings of the job spec's on/off flags: each is an optional<bool> so that an unset flag
// leaves the spec's value alone and --name=false overrides a spec's true, while the bare --name
// and --noname keep working (absl parses neither for an optional<bool>).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace megatrain::client {

// The submit/plan flags that set a boolean of the job spec.
inline constexpr std::string_view kSpecSwitchFlags[] = {"pack", "speculative_update",
                                                        "train_on_prompt", "zero1"};

// Rewrites, in place, "--name" and "-name" to "--name=true" and "--noname" and "-noname" to
// "--name=false" for every name in kSpecSwitchFlags. Everything else, and everything after a
// "--" that ends the flags, is left as it is. Flags read from an absl --flagfile are not seen
// here: write them there as --name=true or --name=false.
void SpellOutSpecSwitches(std::vector<std::string>& args);

}  // namespace megatrain::client
