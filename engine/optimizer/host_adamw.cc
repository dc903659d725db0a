// HostAdamw: cuts the segments into a few contiguous blocks per thread and runs them on the pool.
#include "engine/optimizer/host_adamw.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "engine/optimizer/adamw_range.h"

namespace megatrain::engine {
namespace {

struct Block {
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

std::vector<Block> CutIntoBlocks(absl::Span<const AdamwSegment> segments, size_t block_elements) {
  std::vector<Block> blocks;
  for (const AdamwSegment& segment : segments) {
    const size_t end = segment.offset + segment.count;
    for (size_t begin = segment.offset; begin < end;) {
      const size_t next = std::min(end, (begin / block_elements + 1) * block_elements);
      blocks.push_back({begin, next, segment.weight_decay});
      begin = next;
    }
  }
  return blocks;
}

// Block length: the step split kBlocksPerThread ways per thread, rounded up to
// whole chunks. On this VM (2 cores, 100M-500M parameters, memory-bound)
// blocks of MiBs per stream ran 3-10% faster than 64 KiB chunks handed out in
// turn: each thread's streams stay sequential and the pool's lock is taken a
// few dozen times per step instead of ~30,000 (docs/benchmarks.md §5).
size_t BlockElements(absl::Span<const AdamwSegment> segments, size_t threads) {
  size_t total = 0;
  for (const AdamwSegment& segment : segments) total += segment.count;
  const size_t blocks = std::max<size_t>(1, threads * HostAdamw::kBlocksPerThread);
  const size_t chunk = HostAdamw::kChunkElements;
  const size_t per_block = (total + blocks - 1) / blocks;
  return std::max(chunk, (per_block + chunk - 1) / chunk * chunk);
}

}  // namespace

std::vector<AdamwSegment> SegmentsInRange(absl::Span<const AdamwSegment> segments, size_t first,
                                          size_t count) {
  std::vector<AdamwSegment> out;
  const size_t end = first + count;
  for (const AdamwSegment& s : segments) {
    const size_t begin = std::max(s.offset, first);
    const size_t stop = std::min(s.offset + s.count, end);
    if (begin < stop) out.push_back({begin - first, stop - begin, s.weight_decay});
  }
  return out;
}

HostAdamw::HostAdamw(ThreadPool* pool, SimdIsa isa) : pool_(pool), isa_(isa) {
  if (!SimdIsaSupported(isa)) Die("requested SIMD instruction set is not supported by this CPU");
}

void HostAdamw::StepTo(const kernels::AdamwStepScalars& decay_scalars,
                       const kernels::AdamwStepScalars& no_decay_scalars,
                       absl::Span<const AdamwSegment> segments, const AdamwArrays& arrays,
                       const float* grad, uint16_t* compute_copy_bf16) const {
  CheckNoOverlap(segments);
  const size_t threads = pool_ == nullptr ? 1 : pool_->num_threads();
  const std::vector<Block> blocks = CutIntoBlocks(segments, BlockElements(segments, threads));
  auto run_block = [&](size_t index) {
    const Block& c = blocks[index];
    AdamwRangeTo(isa_, c.weight_decay ? decay_scalars : no_decay_scalars, c.end - c.begin,
                 arrays.From(c.begin), grad + c.begin,
                 compute_copy_bf16 == nullptr ? nullptr : compute_copy_bf16 + c.begin);
  };
  if (pool_ == nullptr) {
    for (size_t i = 0; i < blocks.size(); ++i) run_block(i);
  } else {
    pool_->ParallelFor(blocks.size(), run_block);
  }
}

}  // namespace megatrain::engine
