// RunInChunksOnThreads: splits [0, count) into up to `max_threads` contiguous chunks and runs
// them on short-lived threads (the caller runs the first), for memory-bound host work done once
// per micro-batch where no thread pool is at hand (the embedding gradient's scatter on the
// copy-out stream). Chunks are disjoint, so results do not depend on the thread count.
#pragma once

#include <algorithm>
#include <cstddef>
#include <system_error>
#include <thread>
#include <vector>

namespace megatrain::engine {

// The threads such work may use: the machine's cores, at most `cap` (memory bandwidth stops
// growing well before a big machine's core count).
inline unsigned HostChunkThreads(unsigned cap = 8) {
  return std::clamp(std::thread::hardware_concurrency(), 1u, std::max(cap, 1u));
}

// fn(begin, end) for each chunk; chunk boundaries are multiples of `grain` (except the end), so
// a caller can keep rows or cache lines whole. Blocks until every chunk has run. `fn` must not
// throw. Where no thread can be started (a process or task limit), the caller runs that chunk
// itself: slower, never lost.
template <typename Fn>
void RunInChunksOnThreads(size_t count, unsigned max_threads, size_t grain, Fn&& fn) {
  grain = std::max<size_t>(grain, 1);
  const size_t grains = (count + grain - 1) / grain;
  const size_t threads = std::clamp<size_t>(std::min<size_t>(max_threads, grains), 1, 64);
  const size_t per_thread = (grains + threads - 1) / threads * grain;
  std::vector<std::jthread> workers;
  workers.reserve(threads - 1);
  for (size_t t = 1; t < threads; ++t) {
    const size_t begin = std::min(count, t * per_thread);
    const size_t end = std::min(count, begin + per_thread);
    if (begin >= end) continue;
    try {
      workers.emplace_back([&fn, begin, end] { fn(begin, end); });
    } catch (const std::system_error&) {
      fn(begin, end);
    }
  }
  fn(size_t{0}, std::min(count, per_thread));
}

}  // namespace megatrain::engine
