// HostAdamw: cuts the segments into fixed chunks and runs them on the pool.
#include "engine/optimizer/host_adamw.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "engine/optimizer/adamw_range.h"

namespace megatrain::engine {
namespace {

struct Chunk {
  size_t begin;
  size_t end;
  bool weight_decay;
};

[[noreturn]] void Die(const char* message) {
  std::fprintf(stderr, "HostAdamw: %s\n", message);
  std::abort();
}

void CheckNoOverlap(absl::Span<const AdamwSegment> segments) {
  std::vector<AdamwSegment> sorted(segments.begin(), segments.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const AdamwSegment& a, const AdamwSegment& b) { return a.offset < b.offset; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i - 1].count > 0 && sorted[i - 1].offset + sorted[i - 1].count > sorted[i].offset) {
      Die("segments overlap");
    }
  }
}

std::vector<Chunk> CutIntoChunks(absl::Span<const AdamwSegment> segments, size_t chunk) {
  std::vector<Chunk> chunks;
  for (const AdamwSegment& segment : segments) {
    const size_t end = segment.offset + segment.count;
    for (size_t begin = segment.offset; begin < end;) {
      const size_t next = std::min(end, (begin / chunk + 1) * chunk);
      chunks.push_back({begin, next, segment.weight_decay});
      begin = next;
    }
  }
  return chunks;
}

}  // namespace

HostAdamw::HostAdamw(ThreadPool* pool, SimdIsa isa) : pool_(pool), isa_(isa) {
  if (!SimdIsaSupported(isa)) Die("requested SIMD instruction set is not supported by this CPU");
}

void HostAdamw::Step(const kernels::AdamwStepScalars& decay_scalars,
                     const kernels::AdamwStepScalars& no_decay_scalars,
                     absl::Span<const AdamwSegment> segments, float* param, float* m, float* v,
                     const float* grad, uint16_t* compute_copy_bf16) const {
  CheckNoOverlap(segments);
  const std::vector<Chunk> chunks = CutIntoChunks(segments, kChunkElements);
  auto run_chunk = [&](size_t index) {
    const Chunk& c = chunks[index];
    AdamwRange(isa_, c.weight_decay ? decay_scalars : no_decay_scalars, c.end - c.begin,
               param + c.begin, m + c.begin, v + c.begin, grad + c.begin,
               compute_copy_bf16 == nullptr ? nullptr : compute_copy_bf16 + c.begin);
  };
  if (pool_ == nullptr) {
    for (size_t i = 0; i < chunks.size(); ++i) run_chunk(i);
  } else {
    pool_->ParallelFor(chunks.size(), run_chunk);
  }
}

}  // namespace megatrain::engine
