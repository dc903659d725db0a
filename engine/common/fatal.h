// DieBecause: aborts with a message when a caller breaks an invariant (a programmer error).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace megatrain::engine::internal {

[[noreturn]] inline void DieBecause(std::string_view message) {
  std::fprintf(stderr, "megatrain fatal: %.*s\n", static_cast<int>(message.size()), message.data());
  std::fflush(stderr);
  std::abort();
}

}  // namespace megatrain::engine::internal
