// The rank-ordered float sum, the split of a reduction into owned ranges, and the world of one's
// sum of pairs and reduce-scatter.
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

absl::Status SingleProcessCommunicator::ReduceFloatPairsInRankOrder(float* data, const float* apart,
                                                                    size_t n) {
  for (size_t i = 0; i < n; ++i) data[i] += apart[i];
  return absl::OkStatus();
}

absl::Status SingleProcessCommunicator::ReduceScatterFloatsInRankOrder(const float* send,
                                                                       float* recv, size_t shard) {
  if (recv != send && shard > 0) std::memmove(recv, send, shard * sizeof(float));
  return absl::OkStatus();
}

absl::Status SingleProcessCommunicator::ReduceFloatPairsInRankOrderTo(float* data,
                                                                      const float* apart, size_t n,
                                                                      int root) {
  if (root != 0) return absl::InvalidArgumentError("reduce root must be 0 in a world of 1");
  return ReduceFloatPairsInRankOrder(data, apart, n);
}

}  // namespace megatrain::engine::dist
