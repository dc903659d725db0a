// GradientTurns: contributions land in turn order whatever thread takes its
// turn first, and Abort releases every waiter.
#include "engine/exec/gradient_turns.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace megatrain::engine {
namespace {

TEST(GradientTurnsTest, LaterTurnsWaitForEveryEarlierOne) {
  GradientTurns turns(2);
  absl::Mutex mu;
  std::vector<int> order;
  auto take = [&](int entry, uint64_t turn, int tag) {
    EXPECT_TRUE(turns.WaitForTurn(entry, turn));
    {
      absl::MutexLock lock(&mu);
      order.push_back(tag);
    }
    turns.Landed(entry, turn);
  };
  // Started in reverse order: turn 2 first, then 1, then 0.
  std::thread third(take, 0, 2, 2);
  std::thread second(take, 0, 1, 1);
  std::thread first(take, 0, 0, 0);
  first.join();
  second.join();
  third.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(turns.landed(0), 3u);
  EXPECT_EQ(turns.landed(1), 0u);  // entries are independent
}

TEST(GradientTurnsTest, ResetStartsEveryEntryAgain) {
  GradientTurns turns(1);
  ASSERT_TRUE(turns.WaitForTurn(0, 0));
  turns.Landed(0, 0);
  turns.Reset();
  EXPECT_EQ(turns.landed(0), 0u);
  ASSERT_TRUE(turns.WaitForTurn(0, 0));
  turns.Landed(0, 0);
  EXPECT_EQ(turns.landed(0), 1u);
}

TEST(GradientTurnsTest, AbortReleasesWaitersUntilReset) {
  GradientTurns turns(1);
  bool released = true;
  std::thread waiter([&] { released = turns.WaitForTurn(0, 5); });
  turns.Abort();
  waiter.join();
  EXPECT_FALSE(released);
  EXPECT_FALSE(turns.WaitForTurn(0, 7));
  turns.Reset();
  EXPECT_TRUE(turns.WaitForTurn(0, 0));
}

}  // namespace
}  // namespace megatrain::engine
