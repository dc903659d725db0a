// Zero1Shards: every element has exactly one owner, a rank's part of an entry is one run of whole
// chunks, and the ranks' shares are within one chunk of 1/W even when one entry is most of the
// model (the case whole-entry ownership left on one rank).
#include "engine/exec/zero1_shards.h"

#include <algorithm>
#include <vector>

#include "gtest/gtest.h"

namespace megatrain::engine {
namespace {

void ExpectPartition(const EntryChunks& chunks, const Zero1Shards& shards) {
  for (int e = 0; e < chunks.num_entries(); ++e) {
    std::vector<ElementRange> parts;
    for (int r = 0; r < shards.world(); ++r) {
      const ElementRange range = shards.range(e, r);
      if (range.count == 0) continue;
      EXPECT_EQ(range.first % chunks.chunk_elements(), 0u) << "entry " << e << " rank " << r;
      EXPECT_TRUE(range.end() == chunks.entry_elements(e) ||
                  range.end() % chunks.chunk_elements() == 0)
          << "entry " << e << " rank " << r;
      if (!parts.empty()) {
        EXPECT_EQ(parts.back().end(), range.first) << "ranks in order";
      }
      parts.push_back(range);
      EXPECT_EQ(shards.owner_of(e, range.first), r);
      EXPECT_EQ(shards.owner_of(e, range.end() - 1), r);
    }
    ASSERT_FALSE(parts.empty()) << "entry " << e << " has no owner";
    EXPECT_EQ(parts.front().first, 0u);
    EXPECT_EQ(parts.back().end(), chunks.entry_elements(e));
  }
}

TEST(Zero1Shards, SplitsALargeEntryAmongRanks) {
  // An embedding of 10 chunks and four small entries: each of 4 ranks gets ~1/4.
  const size_t chunk = 1000;
  const EntryChunks chunks({10 * chunk, 300, 300, 300, 299}, chunk);
  for (int world : {1, 2, 3, 4, 7}) {
    const Zero1Shards shards(chunks, world);
    ExpectPartition(chunks, shards);
    size_t total = 0;
    for (int e = 0; e < chunks.num_entries(); ++e) total += chunks.entry_elements(e);
    for (int r = 0; r < world; ++r) {
      size_t mine = 0;
      for (const ElementRange& range : shards.ranges_of(r)) mine += range.count;
      EXPECT_LE(mine, total / world + chunk) << "world " << world << " rank " << r;
      EXPECT_GE(mine + chunk, total / world) << "world " << world << " rank " << r;
    }
  }
  // World 2: the embedding is split, chunks 0-5 to rank 0 (middles below 5599.5), 6-9 to rank 1.
  const Zero1Shards two(chunks, 2);
  EXPECT_EQ(two.range(0, 0), (ElementRange{0, 6 * chunk}));
  EXPECT_EQ(two.range(0, 1), (ElementRange{6 * chunk, 4 * chunk}));
  EXPECT_EQ(two.range(1, 0).count, 0u);
}

TEST(Zero1Shards, MoreRanksThanChunksLeavesSomeEmpty) {
  const EntryChunks chunks({5, 7}, 1024);
  const Zero1Shards shards(chunks, 5);
  ExpectPartition(chunks, shards);
  int owning = 0;
  for (int r = 0; r < 5; ++r) {
    size_t mine = 0;
    for (const ElementRange& range : shards.ranges_of(r)) mine += range.count;
    owning += mine > 0;
  }
  EXPECT_EQ(owning, 2);
}

TEST(Zero1Shards, WholeEntriesWhenChunksAreLarge) {
  // Entries no larger than a chunk: whole entries, balanced by their middles.
  const EntryChunks chunks({100, 100, 100, 100}, 1 << 20);
  const Zero1Shards shards(chunks, 2);
  ExpectPartition(chunks, shards);
  EXPECT_EQ(shards.range(1, 0), (ElementRange{0, 100}));
  EXPECT_EQ(shards.range(2, 1), (ElementRange{0, 100}));
}

}  // namespace
}  // namespace megatrain::engine
