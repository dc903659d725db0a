// CollectiveWatchdog: an overdue collective is reported once, with its name and step; time the
// process did not run is named and not counted; calls that end, a watchdog destroyed mid-call and
// a disabled watchdog report nothing.
#include "engine/dist/collective_watchdog.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <vector>

namespace megatrain::engine::dist {
namespace {

using std::chrono::seconds;

// Collects the reports; the test waits for the n-th on a future (bounded by the test's timeout).
class Reports {
 public:
  CollectiveWatchdog::OnOverdue Callback() {
    return [this](const CollectiveWatchdog::Overdue& o) {
      std::lock_guard<std::mutex> lock(mu_);
      seen_.push_back(o);
      if (seen_.size() <= promises_.size()) promises_[seen_.size() - 1].set_value();
    };
  }
  explicit Reports(int expected) : promises_(static_cast<size_t>(expected)) {}
  void WaitFor(int n) { promises_[static_cast<size_t>(n - 1)].get_future().wait(); }
  std::vector<CollectiveWatchdog::Overdue> seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

 private:
  std::mutex mu_;
  std::vector<std::promise<void>> promises_;
  std::vector<CollectiveWatchdog::Overdue> seen_;
};

TEST(CollectiveWatchdogTest, ReportsAnOverdueCallWithItsNameAndStep) {
  Reports reports(1);
  CollectiveWatchdog watchdog(seconds(1), reports.Callback());
  watchdog.NoteStep(7);
  watchdog.Begin("MPI_Gather(gradient contributions)");
  reports.WaitFor(1);
  watchdog.End();
  const std::vector<CollectiveWatchdog::Overdue> seen = reports.seen();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].collective, "MPI_Gather(gradient contributions)");
  ASSERT_TRUE(seen[0].step.has_value());
  EXPECT_EQ(*seen[0].step, 7u);
  EXPECT_EQ(seen[0].timeout, seconds(1));
}

TEST(CollectiveWatchdogTest, EachOverdueCallIsReportedAgainAfterTheLastEnded) {
  Reports reports(2);
  CollectiveWatchdog watchdog(seconds(1), reports.Callback());
  watchdog.Begin("first");
  reports.WaitFor(1);
  watchdog.End();
  watchdog.Begin("second");
  reports.WaitFor(2);
  watchdog.End();
  const std::vector<CollectiveWatchdog::Overdue> seen = reports.seen();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].collective, "first");
  EXPECT_EQ(seen[1].collective, "second");
  EXPECT_FALSE(seen[1].step.has_value());  // no NoteStep: the report says so
}

TEST(CollectiveWatchdogTest, CallsThatEndAndAWatchdogDestroyedMidCallReportNothing) {
  Reports reports(1);
  {
    CollectiveWatchdog watchdog(seconds(3600), reports.Callback());
    EXPECT_TRUE(watchdog.enabled());
    for (int i = 0; i < 100; ++i) {
      WatchedCollective call(watchdog, "MPI_Bcast");
    }
    watchdog.Begin("MPI_Barrier");  // still in flight when the watchdog goes
  }
  EXPECT_TRUE(reports.seen().empty());
}

TEST(CollectiveWatchdogTest, TimeThisProcessDidNotRunIsNotCounted) {
  // The clock jumps 1000 s at its third reading: Begin reads it (1), the watchdog when it starts
  // watching the call (2), and at its first tick (3), as if the process had been stopped then.
  std::atomic<int> readings{0};
  auto clock = [&readings] {
    const auto now = std::chrono::steady_clock::now();
    return readings.fetch_add(1) >= 2 ? now + seconds(1000) : now;
  };
  Reports reports(1);
  CollectiveWatchdog watchdog(seconds(2), reports.Callback(), clock);
  watchdog.Begin("MPI_Allgather(doubles)");
  reports.WaitFor(1);
  watchdog.End();
  const std::vector<CollectiveWatchdog::Overdue> seen = reports.seen();
  ASSERT_EQ(seen.size(), 1u);
  // Reported (the call still did not complete within 2 s of running time after the stop), and
  // the 1000 s it did not run are named, not counted.
  EXPECT_GE(seen[0].not_running, seconds(1000));
  EXPECT_LT(seen[0].not_running, seconds(1100));
}

TEST(CollectiveWatchdogTest, ATimeoutOfZeroTurnsItOff) {
  Reports reports(1);
  CollectiveWatchdog watchdog(seconds(0), reports.Callback());
  EXPECT_FALSE(watchdog.enabled());
  watchdog.Begin("MPI_Barrier");
  watchdog.End();
  EXPECT_TRUE(reports.seen().empty());
}

}  // namespace
}  // namespace megatrain::engine::dist
