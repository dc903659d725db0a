// HostTaskLane: tasks run only once released, in ticket order, each publishing its ticket; a
// release never waits for a task (the CUDA driver thread calls it); a lane torn down with
// tasks left publishes the newest ticket without running them.
#include "engine/device/host_task_lane.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <vector>

namespace megatrain::engine {
namespace {

// Waits (bounded, so a bug fails instead of hanging) until the lane published `ticket`.
bool AwaitDone(const HostTaskLane& lane, uint32_t ticket) {
  for (int i = 0; i < 600000 && lane.last_done() < ticket; ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return lane.last_done() >= ticket;
}

TEST(HostTaskLaneTest, RunsReleasedTasksInTicketOrderAndPublishesEach) {
  std::atomic<uint32_t> done{77};
  std::vector<int> order;
  std::mutex mu;
  HostTaskLane lane(&done);
  EXPECT_EQ(lane.last_done(), 0u);
  std::vector<uint32_t> tickets;
  for (int i = 0; i < 5; ++i) {
    tickets.push_back(lane.Submit([&order, &mu, i] {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(i);
    }));
  }
  EXPECT_EQ(tickets, (std::vector<uint32_t>{1, 2, 3, 4, 5}));
  lane.ReleaseNext();
  lane.ReleaseNext();
  ASSERT_TRUE(AwaitDone(lane, 2));
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(order, (std::vector<int>{0, 1}));  // the three unreleased tasks have not run
  }
  EXPECT_EQ(lane.last_done(), 2u);
  for (int i = 0; i < 3; ++i) HostTaskLane::ReleaseNextCallback(&lane);
  ASSERT_TRUE(AwaitDone(lane, 5));
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(HostTaskLaneTest, AReleaseNeverWaitsForTheTaskItReleases) {
  std::atomic<uint32_t> done{0};
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  HostTaskLane lane(&done);
  const uint32_t blocking = lane.Submit([opened] { opened.wait(); });
  const uint32_t after = lane.Submit([] {});
  // Both releases return while the first task is blocked: the driver thread stays free.
  lane.ReleaseNext();
  lane.ReleaseNext();
  EXPECT_LT(lane.last_done(), blocking);
  gate.set_value();
  ASSERT_TRUE(AwaitDone(lane, after));
}

TEST(HostTaskLaneTest, TearDownPublishesTheNewestTicketWithoutRunningTheRest) {
  std::atomic<uint32_t> done{0};
  std::atomic<int> ran{0};
  uint32_t last = 0;
  {
    HostTaskLane lane(&done);
    lane.Submit([&ran] { ++ran; });
    lane.ReleaseNext();
    ASSERT_TRUE(AwaitDone(lane, 1));
    lane.Submit([&ran] { ++ran; });
    last = lane.Submit([&ran] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 1);
  EXPECT_EQ(done.load(), last);
}

}  // namespace
}  // namespace megatrain::engine
