// Host-side grouping of a batch's token ids for the deterministic embedding
// backward: the distinct ids in ascending order, and for each the positions of
// its tokens in token order (a counting-sort CSR). The CUDA kernel then gives
// each vocabulary row to one thread per column, which sums that row's tokens
// in token order: no atomics, same bits on every run.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

namespace megatrain::kernels::cuda {

struct EmbeddingGradIndex {
  std::vector<int32_t> unique_rows;      // ascending vocabulary ids
  std::vector<int32_t> segment_offsets;  // unique_rows.size() + 1 entries into token_order
  std::vector<int32_t> token_order;      // token positions grouped by id, each group ascending
};

// Fails (INVALID_ARGUMENT, naming the position and value) on an id outside
// [0, vocab), and on more tokens than int32 can index.
absl::StatusOr<EmbeddingGradIndex> BuildEmbeddingGradIndex(std::span<const int32_t> ids,
                                                           int64_t vocab);

}  // namespace megatrain::kernels::cuda
