// HostAdamw: the multi-threaded SIMD AdamW step over one packed layer buffer
// (fp32 master, m, v, gradient, optional bf16 compute copy) in one pass.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "engine/common/thread_pool.h"
#include "engine/optimizer/adamw_range.h"
#include "engine/optimizer/simd_isa.h"
#include "kernels/common/adamw.h"

namespace megatrain::engine {

// One tensor of a packed layer buffer, in elements. Norm weights and biases
// have weight_decay = false.
struct AdamwSegment {
  size_t offset = 0;
  size_t count = 0;
  bool weight_decay = true;
};

// The parts of `segments` inside elements [first, first + count) of their
// buffer, with offsets counted from `first`: what Step needs to update one
// chunk of a buffer (the update is element-wise, so chunk by chunk gives the
// bits of the whole buffer at once).
std::vector<AdamwSegment> SegmentsInRange(absl::Span<const AdamwSegment> segments, size_t first,
                                          size_t count);

class HostAdamw {
 public:
  // Work is cut at multiples of this many elements of the buffer (64 KiB of
  // fp32), so a task touches whole cache lines of 64-byte-aligned buffers.
  // Results never depend on it: the update is element-wise.
  static constexpr size_t kChunkElements = 16 * 1024;
  // Each pool thread gets about this many contiguous blocks of a step (fewer
  // when the step is small). Long blocks keep each thread's seven streams
  // sequential in memory; sixteen rather than one per thread let a thread
  // that was descheduled hand its share to the others, so the step's tail
  // is at most ~1/32 of it on two threads.
  static constexpr size_t kBlocksPerThread = 16;

  // pool is not owned and may be null (then Step runs on the calling thread).
  // isa must be supported by this CPU (CHECKed); tests pick it, production
  // code takes the default.
  explicit HostAdamw(ThreadPool* pool, SimdIsa isa = BestSupportedSimdIsa());

  SimdIsa isa() const { return isa_; }

  // Applies kernels::AdamwUpdate to every element of every segment of the
  // buffers (decay_scalars for segments with weight_decay, no_decay_scalars
  // otherwise), and writes the bf16 rounding of each new param to
  // compute_copy_bf16 at the same index when it is non-null. Elements outside
  // the segments are not touched. Segments must not overlap (CHECKed).
  // Blocks until done. Bitwise identical for any pool size and any isa.
  void Step(const kernels::AdamwStepScalars& decay_scalars,
            const kernels::AdamwStepScalars& no_decay_scalars,
            absl::Span<const AdamwSegment> segments, float* param, float* m, float* v,
            const float* grad, uint16_t* compute_copy_bf16) const {
    StepTo(decay_scalars, no_decay_scalars, segments, AdamwArrays::InPlace(param, m, v), grad,
           compute_copy_bf16);
  }
  // Step out of place (the speculative update of state in RAM): reads arrays.param/m/v, writes
  // the new values to arrays.param_out/m_out/v_out, the same bits as Step would leave in place.
  // Only the segments' elements of the outputs are written.
  void StepTo(const kernels::AdamwStepScalars& decay_scalars,
              const kernels::AdamwStepScalars& no_decay_scalars,
              absl::Span<const AdamwSegment> segments, const AdamwArrays& arrays,
              const float* grad, uint16_t* compute_copy_bf16) const;

 private:
  ThreadPool* pool_;
  SimdIsa isa_;
};

}  // namespace megatrain::engine
