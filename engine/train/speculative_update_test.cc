// Tests of SpeculativeUpdate: entries are updated in the order reported, after `prepare`; a
// `false` from the update stops the rest; the first error is kept and stops the rest; Finish is
// idempotent and a new Begin starts afresh.
#include "engine/train/speculative_update.h"

#include <atomic>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace megatrain::engine {
namespace {

TEST(SpeculativeUpdateTest, UpdatesReportedEntriesInOrderAfterPrepare) {
  SpeculativeUpdate speculation(5);
  absl::Notification may_start;
  std::vector<int> order;  // written by the speculation thread, read after Finish
  bool prepared_first = false;
  speculation.Begin([&] { may_start.WaitForNotification(); },
                    [&](int e) -> absl::StatusOr<bool> {
                      prepared_first = may_start.HasBeenNotified();
                      order.push_back(e);
                      return true;
                    });
  EXPECT_TRUE(speculation.running());
  for (int e : {4, 3, 1}) speculation.EntryFinal(e);  // reported before prepare returns
  may_start.Notify();
  speculation.EntryFinal(0);
  const SpeculativeUpdate::Outcome outcome = speculation.Finish();
  EXPECT_FALSE(speculation.running());
  EXPECT_TRUE(prepared_first);
  EXPECT_EQ(order, (std::vector<int>{4, 3, 1, 0}));
  EXPECT_EQ(outcome.count, 4);
  EXPECT_EQ(outcome.updated, (std::vector<bool>{true, true, false, true, true}));
  EXPECT_FALSE(outcome.stopped);
  EXPECT_TRUE(outcome.status.ok());
  // Idempotent: nothing is running now.
  EXPECT_EQ(speculation.Finish().count, 0);
}

TEST(SpeculativeUpdateTest, AFalseStopsTheRestAndAnErrorIsKept) {
  SpeculativeUpdate speculation(4);
  std::atomic<int> calls = 0;
  speculation.Begin([] {},
                    [&](int e) -> absl::StatusOr<bool> {
                      ++calls;
                      return e != 2;  // entry 2 says the speculation cannot commit
                    });
  for (int e : {3, 2, 1, 0}) speculation.EntryFinal(e);
  SpeculativeUpdate::Outcome outcome = speculation.Finish();
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(outcome.stopped);
  EXPECT_EQ(outcome.count, 1);
  EXPECT_EQ(outcome.updated, (std::vector<bool>{false, false, false, true}));

  // A new step starts afresh; the first error stops it and is returned.
  calls = 0;
  speculation.Begin([] {},
                    [&](int e) -> absl::StatusOr<bool> {
                      ++calls;
                      if (e == 1) return absl::DataLossError("optimizer_state.bin at offset 4096");
                      return true;
                    });
  for (int e : {3, 1, 0}) speculation.EntryFinal(e);
  outcome = speculation.Finish();
  EXPECT_EQ(calls, 2);
  EXPECT_FALSE(outcome.stopped);
  EXPECT_EQ(outcome.count, 1);
  EXPECT_EQ(outcome.status.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(outcome.status.message(), "optimizer_state.bin at offset 4096");
}

}  // namespace
}  // namespace megatrain::engine
