// The build identity recorded in every checkpoint manifest.
#pragma once

#include <string>

namespace megatrain::engine {

// Bumped by hand at releases; there is no build stamping yet.
inline constexpr char kMegatrainVersion[] = "0.1.0";

// "megatrain 0.1.0 (<compiler version>)".
inline std::string BuildVersionString() {
#if defined(__VERSION__)
  return std::string("megatrain ") + kMegatrainVersion + " (" + __VERSION__ + ")";
#else
  return std::string("megatrain ") + kMegatrainVersion;
#endif
}

}  // namespace megatrain::engine
