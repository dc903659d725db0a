// Gradient-norm pieces of the global clip: a deterministic multi-threaded sum
// of squares per layer buffer, the global norm over layers, and the clip
// coefficient of torch.nn.utils.clip_grad_norm_.
//
// Summation scheme (fixed; independent of thread count and SIMD width):
//  1. The buffer is cut into chunks of kGradNormChunkElements from its start.
//  2. Within a chunk, element j (counted from the chunk start) is squared in
//     double (exact: a float's square fits a double's mantissa) and added to
//     accumulator j % kGradNormLanes, each accumulator summing in element order.
//  3. A chunk's sum is the accumulators added in lane order 0..15.
//  4. The buffer's sum is the chunk sums added in chunk order.
// Positive terms only, so the relative error is at most about
// (kGradNormChunkElements / kGradNormLanes + kGradNormLanes + chunks) * 2^-53.
#pragma once

#include <cstddef>

#include "absl/types/span.h"
#include "engine/common/thread_pool.h"
#include "engine/optimizer/simd_isa.h"

namespace megatrain::engine {

inline constexpr size_t kGradNormChunkElements = 64 * 1024;
inline constexpr size_t kGradNormLanes = 16;

// Sum of squares of grad, by the scheme above; chunks run on pool (null: the
// calling thread). isa must be supported (CHECKed). NaN or inf elements make
// the result non-finite.
double GradSumOfSquares(absl::Span<const float> grad, ThreadPool* pool,
                        SimdIsa isa = BestSupportedSimdIsa());

// The chunk sums of steps 1-3 of the scheme for grad's chunks, written to
// partials[0 .. ceil(size / kGradNormChunkElements)). A buffer streamed in
// pieces that start at multiples of kGradNormChunkElements gets, piece by
// piece, exactly the partials of the whole buffer; SumPartials (step 4) then
// gives GradSumOfSquares' bits.
void GradChunkSumsOfSquares(absl::Span<const float> grad, ThreadPool* pool, double* partials,
                            SimdIsa isa = BestSupportedSimdIsa());
double SumPartials(absl::Span<const double> partials);

// sqrt of the per-layer sums of squares added in layer order.
double GlobalGradNorm(absl::Span<const double> per_layer_sum_of_squares);

// min(1, max_norm / (total_norm + 1e-6)), as torch.nn.utils.clip_grad_norm_.
double ClipCoefficient(double total_norm, double max_norm);

// False for NaN or inf: such a step is skipped (DESIGN.md, non-finite values).
bool GradNormIsFinite(double total_norm);

}  // namespace megatrain::engine
