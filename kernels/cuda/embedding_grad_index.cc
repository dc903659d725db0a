// Counting-sort grouping of token ids for the embedding backward.
#include "kernels/cuda/embedding_grad_index.h"

#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace megatrain::kernels::cuda {

absl::StatusOr<EmbeddingGradIndex> BuildEmbeddingGradIndex(std::span<const int32_t> ids,
                                                           int64_t vocab) {
  if (ids.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat("ids.size() = ", ids.size(), " exceeds int32"));
  }
  if (vocab <= 0 || vocab > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("vocab = ", vocab, " must be in [1, 2^31)"));
  }
  std::vector<int32_t> counts(static_cast<size_t>(vocab), 0);
  for (size_t t = 0; t < ids.size(); ++t) {
    if (ids[t] < 0 || ids[t] >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("ids[", t, "] = ", ids[t], " is outside [0, ", vocab, ")"));
    }
    ++counts[static_cast<size_t>(ids[t])];
  }
  EmbeddingGradIndex index;
  // position_of[id] = start of id's segment, advanced as its tokens are placed.
  std::vector<int32_t> position_of(static_cast<size_t>(vocab), 0);
  int32_t running = 0;
  index.segment_offsets.push_back(0);
  for (int64_t id = 0; id < vocab; ++id) {
    const int32_t count = counts[static_cast<size_t>(id)];
    if (count == 0) continue;
    index.unique_rows.push_back(static_cast<int32_t>(id));
    position_of[static_cast<size_t>(id)] = running;
    running += count;
    index.segment_offsets.push_back(running);
  }
  index.token_order.resize(ids.size());
  for (size_t t = 0; t < ids.size(); ++t) {
    index.token_order[static_cast<size_t>(position_of[static_cast<size_t>(ids[t])]++)] =
        static_cast<int32_t>(t);
  }
  return index;
}

}  // namespace megatrain::kernels::cuda
