// The block emulator keeps CUDA's rules: __syncthreads orders shared-memory
// writes, shuffles read the right lane, every (block, thread) runs once,
// shared memory is per block and starts poisoned, and a divergent barrier or
// an illegal shuffle is reported instead of hanging.
#include "kernels/cuda/testing/block_emulator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cuda/device_shim.h"

namespace megatrain::kernels::cuda::testing {
namespace {

TEST(BlockEmulatorTest, SyncThreadsOrdersSharedWritesBeforeReads) {
  constexpr int kThreads = 96;
  std::vector<float> seen(3 * kThreads, -1.0f);
  const EmulatedGrid grid{3, 1, kThreads, kThreads * sizeof(float)};
  // Round 1 writes slot t; round 2 reads slot t + 1 (written by another
  // thread): only a real barrier between them makes every read see round 1.
  const absl::Status status = RunEmulatedGrid(grid, [&](const EmulatedThread& t) {
    float* slots = static_cast<float*>(t.shared);
    slots[MT_THREAD_X()] = static_cast<float>(MT_BLOCK_X() * 1000 + MT_THREAD_X());
    MT_SYNC_THREADS();
    const float read = slots[(MT_THREAD_X() + 1) % kThreads];
    MT_SYNC_THREADS();
    slots[MT_THREAD_X()] = -5.0f;  // would corrupt a slower reader without the second barrier
    seen[static_cast<size_t>(MT_BLOCK_X() * kThreads + MT_THREAD_X())] = read;
  });
  ASSERT_TRUE(status.ok()) << status;
  for (int b = 0; b < 3; ++b) {
    for (int t = 0; t < kThreads; ++t) {
      EXPECT_EQ(seen[static_cast<size_t>(b * kThreads + t)],
                static_cast<float>(b * 1000 + (t + 1) % kThreads))
          << "block " << b << " thread " << t;
    }
  }
}

TEST(BlockEmulatorTest, ShufflesReadTheCudaSourceLane) {
  constexpr int kThreads = 64;
  std::vector<float> xor_result(kThreads), down_result(kThreads);
  const absl::Status status =
      RunEmulatedGrid(EmulatedGrid{1, 1, kThreads, 0}, [&](const EmulatedThread& t) {
        const float mine = static_cast<float>(t.thread);
        xor_result[static_cast<size_t>(t.thread)] = MT_SHFL_XOR(0xffffffffu, mine, 5);
        down_result[static_cast<size_t>(t.thread)] = EmulatedShflDown(0xffffffffu, mine, 3);
      });
  ASSERT_TRUE(status.ok()) << status;
  for (int t = 0; t < kThreads; ++t) {
    const int warp_base = t / 32 * 32, lane = t % 32;
    EXPECT_EQ(xor_result[static_cast<size_t>(t)], static_cast<float>(warp_base + (lane ^ 5)));
    // Past the warp's last lane a thread keeps its own value.
    EXPECT_EQ(down_result[static_cast<size_t>(t)], static_cast<float>(lane + 3 < 32 ? t + 3 : t));
  }
}

TEST(BlockEmulatorTest, EveryBlockAndThreadRunsOnceInBlockOrder) {
  std::mutex mu;
  std::vector<int> runs(4 * 3 * 33, 0);
  std::vector<int64_t> block_order;
  const absl::Status status =
      RunEmulatedGrid(EmulatedGrid{4, 3, 33, 0}, [&](const EmulatedThread& t) {
        EXPECT_EQ(t.block_x, MT_BLOCK_X());
        EXPECT_EQ(MT_BLOCK_DIM_X(), 33u);
        std::lock_guard<std::mutex> lock(mu);
        ++runs[static_cast<size_t>((t.block_y * 4 + t.block_x) * 33 + t.thread)];
        if (t.thread == 0) block_order.push_back(t.block_y * 4 + t.block_x);
      });
  ASSERT_TRUE(status.ok()) << status;
  for (int r : runs) EXPECT_EQ(r, 1);
  ASSERT_EQ(block_order.size(), 12u);
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(block_order[static_cast<size_t>(i)], i);
}

// Between two barriers the threads run one after another: in thread order in even blocks, in
// reverse in odd ones, so a read that a missing barrier leaves unordered sees the poison in one
// of them whichever thread writes.
TEST(BlockEmulatorTest, ThreadsRunInOrderInEvenBlocksAndInReverseInOddOnes) {
  constexpr int kThreads = 64;
  std::vector<std::vector<int>> order(3);
  std::vector<int> unordered_reads_poisoned(3, 0);
  const absl::Status status = RunEmulatedGrid(
      EmulatedGrid{3, 1, kThreads, kThreads * sizeof(float)}, [&](const EmulatedThread& t) {
        order[static_cast<size_t>(t.block_x)].push_back(t.thread);
        float* slots = static_cast<float*>(t.shared);
        slots[t.thread] = 1.0f;
        // No barrier: thread 0 reads thread 1's slot.
        if (t.thread == 0 && std::isnan(slots[1])) ++unordered_reads_poisoned[t.block_x];
        MT_SYNC_THREADS();
      });
  ASSERT_TRUE(status.ok()) << status;
  for (int b = 0; b < 3; ++b) {
    ASSERT_EQ(order[static_cast<size_t>(b)].size(), static_cast<size_t>(kThreads));
    for (int i = 0; i < kThreads; ++i) {
      EXPECT_EQ(order[static_cast<size_t>(b)][static_cast<size_t>(i)],
                b % 2 == 0 ? i : kThreads - 1 - i)
          << "block " << b << " position " << i;
    }
  }
  EXPECT_EQ(unordered_reads_poisoned, (std::vector<int>{1, 0, 1}));
}

TEST(BlockEmulatorTest, SharedMemoryStartsPoisonedInEveryBlock) {
  std::atomic<int> poisoned{0};
  const absl::Status status =
      RunEmulatedGrid(EmulatedGrid{2, 1, 32, 32 * sizeof(float)}, [&](const EmulatedThread& t) {
        float* slots = static_cast<float*>(t.shared);
        if (std::isnan(slots[t.thread])) ++poisoned;
        MT_SYNC_THREADS();
        slots[t.thread] = 1.0f;  // the next block must not see this
      });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(poisoned.load(), 64);
}

TEST(BlockEmulatorTest, DivergentSyncThreadsIsAnErrorNotAHang) {
  const absl::Status status =
      RunEmulatedGrid(EmulatedGrid{2, 1, 64, 0}, [&](const EmulatedThread& t) {
        if (t.block_x == 1 && t.thread == 7) return;  // skips the barrier below
        MT_SYNC_THREADS();
        MT_SYNC_THREADS();
      });
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("block (1, 0)"), std::string::npos) << status;
  EXPECT_NE(status.message().find("thread 7"), std::string::npos) << status;
  EXPECT_NE(status.message().find("__syncthreads"), std::string::npos) << status;
}

TEST(BlockEmulatorTest, ShuffleOutsideWholeWarpsIsRejected) {
  const absl::Status status =
      RunEmulatedGrid(EmulatedGrid{1, 1, 48, 0},
                      [&](const EmulatedThread&) { (void)MT_SHFL_XOR(0xffffffffu, 1.0f, 1); });
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("whole warps"), std::string::npos) << status;
}

TEST(BlockEmulatorTest, NotACudaLaunchIsInvalid) {
  EXPECT_EQ(RunEmulatedGrid(EmulatedGrid{1, 1, 2048, 0}, [](const EmulatedThread&) {}).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace megatrain::kernels::cuda::testing
