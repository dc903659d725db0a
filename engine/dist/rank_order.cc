// The rank-ordered float sum and the split of a reduction into owned ranges.
#include <cstring>

#include "engine/dist/communicator.h"

namespace megatrain::engine::dist {

OwnedRange OwnedRangeOf(size_t n, int rank, int world) {
  const size_t r = static_cast<size_t>(rank);
  const size_t w = static_cast<size_t>(world);
  return OwnedRange{n * r / w, n * (r + 1) / w};
}

void SumInRankOrder(const float* contributions, int count, size_t n, float* out) {
  if (count <= 0 || n == 0) return;
  std::memcpy(out, contributions, n * sizeof(float));
  for (int c = 1; c < count; ++c) {
    const float* add = contributions + static_cast<size_t>(c) * n;
    // One rounding per element per contribution, in rank order: what the executor's
    // host += staged does for micro-batch c of an accumulation step.
    for (size_t i = 0; i < n; ++i) out[i] += add[i];
  }
}

}  // namespace megatrain::engine::dist
