// RunInChunksOnThreads covers every index exactly once, keeps chunk boundaries on the grain,
// and handles empty, tiny and uneven counts.
#include "engine/common/parallel_chunks.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <utility>
#include <vector>

namespace megatrain::engine {
namespace {

TEST(RunInChunksOnThreadsTest, CoversEveryIndexOnceOnGrainBoundaries) {
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{4099}}) {
    for (unsigned threads : {1u, 2u, 3u, 8u}) {
      for (size_t grain : {size_t{1}, size_t{16}, size_t{1000}}) {
        std::vector<std::atomic<int>> hits(count);
        std::mutex mu;
        std::vector<std::pair<size_t, size_t>> chunks;
        RunInChunksOnThreads(count, threads, grain, [&](size_t begin, size_t end) {
          for (size_t i = begin; i < end; ++i) hits[i].fetch_add(1);
          std::lock_guard<std::mutex> lock(mu);
          chunks.emplace_back(begin, end);
        });
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(hits[i].load(), 1) << count << " " << i;
        EXPECT_LE(chunks.size(), std::max<size_t>(threads, 1));
        for (const auto& [begin, end] : chunks) {
          EXPECT_EQ(begin % grain, 0u);
          EXPECT_TRUE(end == count || end % grain == 0) << begin << "-" << end;
        }
      }
    }
  }
}

TEST(RunInChunksOnThreadsTest, HostChunkThreadsIsCapped) {
  EXPECT_GE(HostChunkThreads(), 1u);
  EXPECT_LE(HostChunkThreads(), 8u);
  EXPECT_EQ(HostChunkThreads(1), 1u);
}

}  // namespace
}  // namespace megatrain::engine
