// Tests for ArenaAllocator: exact fill, the out-of-memory message, best fit, coalescing, peak.
#include "engine/device/arena_allocator.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::engine {
namespace {

using ::testing::HasSubstr;

TEST(ArenaAllocatorTest, FillsAnOddCapacityExactlyThenRefusesOneByteWithTheNumbers) {
  ArenaAllocator arena(10000);  // not a multiple of 256
  absl::StatusOr<size_t> a = arena.Allocate(1000, "a");
  absl::StatusOr<size_t> b = arena.Allocate(5000, "b");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, 0u);
  EXPECT_EQ(*b, 1024u);  // 1000 rounded up to 256
  absl::StatusOr<size_t> rest = arena.Allocate(10000 - 1024 - 5120, "rest");
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_EQ(*rest, 1024u + 5120u);
  EXPECT_EQ(arena.stats().in_use, 10000u);
  EXPECT_EQ(arena.stats().largest_free_block, 0u);

  absl::StatusOr<size_t> more = arena.Allocate(1, "one.more.byte");
  ASSERT_FALSE(more.ok());
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(more.status().ToString(), HasSubstr("requested 1 bytes"));
  EXPECT_THAT(more.status().ToString(), HasSubstr("'one.more.byte'"));
  EXPECT_THAT(more.status().ToString(), HasSubstr("capacity 10000"));
  EXPECT_THAT(more.status().ToString(), HasSubstr("in use 10000"));
  EXPECT_THAT(more.status().ToString(), HasSubstr("largest free block 0"));
}

TEST(ArenaAllocatorTest, RefusesZeroBytes) {
  ArenaAllocator arena(4096);
  absl::StatusOr<size_t> none = arena.Allocate(0, "empty");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.status().ToString(), HasSubstr("empty"));
}

TEST(ArenaAllocatorTest, FreeingNeighboursCoalescesSoALargeBlockFitsAgain) {
  ArenaAllocator arena(4 * 768);
  std::vector<size_t> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(*arena.Allocate(641, "block"));
  EXPECT_EQ(blocks, (std::vector<size_t>{0, 768, 1536, 2304}));
  ASSERT_FALSE(arena.Allocate(1, "full").ok());

  arena.Free(blocks[0]);
  arena.Free(blocks[2]);
  EXPECT_EQ(arena.stats().largest_free_block, 768u);
  EXPECT_FALSE(arena.Allocate(3 * 768, "too.big.while.fragmented").ok());
  arena.Free(blocks[1]);  // merges with both neighbours
  EXPECT_EQ(arena.stats().largest_free_block, 3u * 768u);
  absl::StatusOr<size_t> big = arena.Allocate(3 * 768 - 5, "big");
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(*big, 0u);
}

TEST(ArenaAllocatorTest, BestFitPrefersTheSmallestRangeThatHolds) {
  ArenaAllocator arena(16 * 256);
  const size_t wide = *arena.Allocate(4 * 256, "wide");      // [0, 1024)
  const size_t keep1 = *arena.Allocate(256, "keep1");        // [1024, 1280)
  const size_t narrow = *arena.Allocate(2 * 256, "narrow");  // [1280, 1792)
  const size_t keep2 = *arena.Allocate(9 * 256, "keep2");    // the rest
  arena.Free(wide);
  arena.Free(narrow);
  absl::StatusOr<size_t> small = arena.Allocate(300, "small");
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(*small, narrow);  // not the lower-offset wide range
  arena.Free(*small);
  arena.Free(keep1);
  arena.Free(keep2);
  EXPECT_EQ(arena.stats().largest_free_block, 16u * 256u);
}

TEST(ArenaAllocatorTest, TracksPeakAndResetsIt) {
  ArenaAllocator arena(8192);
  const size_t a = *arena.Allocate(3000, "a");  // 3072
  const size_t b = *arena.Allocate(1000, "b");  // 1024
  arena.Free(a);
  ArenaStats stats = arena.stats();
  EXPECT_EQ(stats.in_use, 1024u);
  EXPECT_EQ(stats.peak, 4096u);
  EXPECT_EQ(stats.allocations, 1u);
  EXPECT_EQ(stats.total_allocations, 2u);
  arena.ResetPeak();
  EXPECT_EQ(arena.stats().peak, 1024u);
  arena.Free(b);
  EXPECT_EQ(arena.stats().peak, 1024u);
  EXPECT_EQ(arena.stats().in_use, 0u);
}

// Random allocate/free with odd sizes: blocks never overlap, stay aligned, the accounting adds
// up, and the same seed gives the same offsets (determinism).
std::vector<size_t> RunRandomWorkload(uint32_t seed) {
  constexpr size_t kCapacity = 1 << 20;
  ArenaAllocator arena(kCapacity);
  std::mt19937 rng(seed);
  struct Live {
    size_t offset, size;
  };
  std::vector<Live> live;
  std::vector<size_t> offsets;
  for (int step = 0; step < 3000; ++step) {
    if (!live.empty() && rng() % 3 == 0) {
      const size_t index = rng() % live.size();
      arena.Free(live[index].offset);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(index));
      continue;
    }
    const size_t bytes = 1 + rng() % 20011;
    absl::StatusOr<size_t> offset = arena.Allocate(bytes, "random");
    if (!offset.ok()) {
      EXPECT_EQ(offset.status().code(), absl::StatusCode::kResourceExhausted);
      continue;
    }
    EXPECT_EQ(*offset % ArenaAllocator::kAlignment, 0u);
    EXPECT_LE(*offset + bytes, kCapacity);
    for (const Live& other : live) {
      EXPECT_TRUE(*offset + bytes <= other.offset || other.offset + other.size <= *offset);
    }
    live.push_back({*offset, bytes});
    offsets.push_back(*offset);
  }
  size_t footprint = 0;
  for (const Live& block : live) footprint += (block.size + 255) / 256 * 256;
  EXPECT_EQ(arena.stats().in_use, footprint);
  EXPECT_EQ(arena.stats().allocations, live.size());
  for (const Live& block : live) arena.Free(block.offset);
  EXPECT_EQ(arena.stats().in_use, 0u);
  EXPECT_EQ(arena.stats().largest_free_block, kCapacity);
  return offsets;
}

TEST(ArenaAllocatorTest, RandomWorkloadIsConsistentAndDeterministic) {
  const std::vector<size_t> first = RunRandomWorkload(1234);
  const std::vector<size_t> second = RunRandomWorkload(1234);
  EXPECT_EQ(first, second);
  EXPECT_GT(first.size(), 1000u);
}

TEST(ArenaAllocatorDeathTest, DoubleFreeIsAProgrammerError) {
  ArenaAllocator arena(4096);
  const size_t block = *arena.Allocate(10, "x");
  arena.Free(block);
  EXPECT_DEATH(arena.Free(block), "not a live block");
}

}  // namespace
}  // namespace megatrain::engine
