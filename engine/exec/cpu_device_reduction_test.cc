// CpuDeviceReduction: each rank's shard is the rank-ordered sum of every rank's buffer, bit for
// bit; calls match across ranks in order; an abort frees every waiter.
#include "engine/exec/cpu_device_reduction.h"

#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "engine/device/cpu_device.h"
#include "gtest/gtest.h"

namespace megatrain::engine {
namespace {

struct Rank {
  std::unique_ptr<CpuDevice> device;
  std::unique_ptr<Stream> stream;
};

std::vector<Rank> MakeRanks(int world) {
  std::vector<Rank> ranks;
  for (int r = 0; r < world; ++r) {
    DeviceOptions options;
    options.arena_bytes = 1 << 20;
    auto device = CpuDevice::Create(options);
    EXPECT_TRUE(device.ok()) << device.status();
    auto stream = (*device)->CreateStream("copy_out");
    EXPECT_TRUE(stream.ok()) << stream.status();
    ranks.push_back({std::move(*device), std::move(*stream)});
  }
  return ranks;
}

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

class CpuDeviceReductionTest : public ::testing::TestWithParam<int> {};

TEST_P(CpuDeviceReductionTest, EveryShardIsTheRankOrderedSumBitForBit) {
  const int world = GetParam();
  std::vector<Rank> ranks = MakeRanks(world);
  CpuDeviceReduction reduction(world);
  std::mt19937 rng(7 + world);
  std::uniform_real_distribution<float> value(-3.0f, 3.0f);
  // Several calls of odd sizes back to back, as an executor enqueues one per entry.
  for (size_t n : {size_t{1}, size_t{7}, size_t{4097}, size_t{100003}}) {
    const size_t shard = ReductionShardElements(n, world);
    std::vector<std::vector<float>> buffers(static_cast<size_t>(world),
                                            std::vector<float>(shard * world));
    for (auto& b : buffers) {
      for (float& x : b) x = value(rng);
      b[0] = -0.0f;  // -0.0 + -0.0 stays -0.0, as one device's adds keep it
    }
    const std::vector<std::vector<float>> inputs = buffers;
    for (int r = 0; r < world; ++r) {
      ASSERT_TRUE(reduction
                      .EnqueueReduceScatter(r, *ranks[r].stream, buffers[r].data(),
                                            buffers[r].data() + r * shard, shard,
                                            {SpanKind::kCopyOut, "reduce-scatter", -1})
                      .ok());
    }
    for (Rank& rank : ranks) ASSERT_TRUE(rank.stream->Synchronize().ok());
    for (int r = 0; r < world; ++r) {
      for (size_t j = r * shard; j < (r + 1) * shard; ++j) {
        float expected = inputs[0][j];
        for (int q = 1; q < world; ++q) expected += inputs[q][j];
        ASSERT_EQ(Bits(buffers[r][j]), Bits(expected)) << "rank " << r << " element " << j;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, CpuDeviceReductionTest, ::testing::Values(1, 2, 3));

// Into a buffer of the rank's shard (a later micro-batch's, before it is added to the sums):
// the same bits, and every send left as it was.
TEST(CpuDeviceReduction, IntoAShardBufferLeavesTheSendsAlone) {
  std::vector<Rank> ranks = MakeRanks(3);
  CpuDeviceReduction reduction(3);
  const size_t shard = 5;
  std::vector<std::vector<float>> sends(3), recvs(3, std::vector<float>(shard, 0.0f));
  for (int r = 0; r < 3; ++r) {
    for (size_t j = 0; j < 3 * shard; ++j) sends[r].push_back(0.25f * (r + 1) + 0.001f * j);
  }
  const std::vector<std::vector<float>> inputs = sends;
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(
        reduction
            .EnqueueReduceScatter(r, *ranks[r].stream, sends[r].data(), recvs[r].data(), shard, {})
            .ok());
  }
  for (Rank& rank : ranks) ASSERT_TRUE(rank.stream->Synchronize().ok());
  EXPECT_EQ(sends, inputs);
  for (int r = 0; r < 3; ++r) {
    for (size_t j = 0; j < shard; ++j) {
      const size_t i = r * shard + j;
      EXPECT_EQ(Bits(recvs[r][j]), Bits((inputs[0][i] + inputs[1][i]) + inputs[2][i]));
    }
  }
}

TEST(CpuDeviceReduction, AbortFreesARankWaitingForAPeerThatNeverCalls) {
  std::vector<Rank> ranks = MakeRanks(2);
  CpuDeviceReduction reduction(2);
  std::vector<float> buffer(8, 1.0f);
  ASSERT_TRUE(
      reduction.EnqueueReduceScatter(0, *ranks[0].stream, buffer.data(), buffer.data(), 4, {})
          .ok());
  // Rank 1 never calls: its micro-batch failed. Abort from another thread, as its lane does.
  std::thread aborter([&] { reduction.Abort(); });
  const absl::Status waited = ranks[0].stream->Synchronize();
  aborter.join();
  // The waiter is released with its buffer untouched and its stream healthy (stream errors are
  // sticky; the step fails through the micro-batch that failed).
  EXPECT_TRUE(waited.ok()) << waited;
  EXPECT_EQ(buffer, std::vector<float>(8, 1.0f));
  // The next step starts afresh on the same streams.
  reduction.Reset();
  std::vector<float> other(8, 2.0f);
  ASSERT_TRUE(
      reduction.EnqueueReduceScatter(0, *ranks[0].stream, buffer.data(), buffer.data(), 4, {})
          .ok());
  ASSERT_TRUE(
      reduction.EnqueueReduceScatter(1, *ranks[1].stream, other.data(), other.data() + 4, 4, {})
          .ok());
  ASSERT_TRUE(ranks[0].stream->Synchronize().ok());
  ASSERT_TRUE(ranks[1].stream->Synchronize().ok());
  EXPECT_EQ(buffer[0], 3.0f);
  EXPECT_EQ(other[4], 3.0f);
}

TEST(CpuDeviceReduction, RanksOutOfStepFailEveryRankNamingTheSizes) {
  std::vector<Rank> ranks = MakeRanks(2);
  CpuDeviceReduction reduction(2);
  std::vector<float> a(8), b(10);
  ASSERT_TRUE(reduction.EnqueueReduceScatter(0, *ranks[0].stream, a.data(), a.data(), 4, {}).ok());
  ASSERT_TRUE(
      reduction.EnqueueReduceScatter(1, *ranks[1].stream, b.data(), b.data() + 5, 5, {}).ok());
  const absl::Status s0 = ranks[0].stream->Synchronize();
  const absl::Status s1 = ranks[1].stream->Synchronize();
  EXPECT_EQ(s0.code(), absl::StatusCode::kInternal) << s0;
  EXPECT_EQ(s1.code(), absl::StatusCode::kInternal) << s1;
  EXPECT_NE(s1.message().find("shard_elements="), std::string_view::npos) << s1;
}

TEST(CpuDeviceReduction, RefusesARankOutsideTheWorldAndANullBuffer) {
  std::vector<Rank> ranks = MakeRanks(1);
  CpuDeviceReduction reduction(2);
  float x[4];
  const absl::Status outside = reduction.EnqueueReduceScatter(2, *ranks[0].stream, x, x, 2, {});
  EXPECT_EQ(outside.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(outside.message().find("rank=2"), std::string_view::npos) << outside;
  const absl::Status null = reduction.EnqueueReduceScatter(0, *ranks[0].stream, nullptr, x, 2, {});
  EXPECT_EQ(null.code(), absl::StatusCode::kInvalidArgument) << null;
}

}  // namespace
}  // namespace megatrain::engine
