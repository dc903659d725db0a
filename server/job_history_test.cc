// JobHistories: what one step adds to a job's history, validation samples only when an
// evaluation changed them, the latest layer timings, NVMe totals, bounded series, removal.
#include "server/job_history.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace megatrain::server {
namespace {

engine::StepReport Report(uint64_t step, double loss) {
  engine::StepReport r;
  r.step = step;
  r.loss = loss;
  r.learning_rate = 1e-3;
  r.grad_norm = 0.5;
  r.tokens_per_second = 1000;
  r.nvme_bytes_read = 10;
  r.nvme_bytes_written = 20;
  r.layers.resize(3);
  r.layers[1].copy_in_seconds = 0.25;
  r.layers[1].stall_seconds = 0.125;
  return r;
}

TEST(JobHistoriesTest, RecordsStepsLayersAndNvmeTotals) {
  JobHistories histories;
  EXPECT_FALSE(histories.Get("a").has_value());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  histories.Record("a", Report(1, 5.0), nan, 1000);
  histories.Record("a", Report(2, 4.0), 4.5, 2000);
  histories.Record("a", Report(3, 3.0), 4.5, 3000);  // no new evaluation
  histories.Record("a", Report(4, 2.0), 3.5, 4000);
  const std::optional<v1::JobHistory> h = histories.Get("a");
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->job_id(), "a");
  ASSERT_EQ(h->steps_size(), 4);
  EXPECT_EQ(h->steps(3).step(), 4u);
  EXPECT_EQ(h->steps(3).loss(), 2.0);
  EXPECT_EQ(h->steps(3).unix_ms(), 4000);
  EXPECT_EQ(h->steps(0).grad_norm(), 0.5);
  ASSERT_EQ(h->validation_size(), 2);
  EXPECT_EQ(h->validation(0).step(), 2u);
  EXPECT_EQ(h->validation(1).validation_loss(), 3.5);
  EXPECT_EQ(h->layers_step(), 4u);
  ASSERT_EQ(h->layers_size(), 3);
  EXPECT_EQ(h->layers(1).copy_in_seconds(), 0.25);
  EXPECT_EQ(h->layers(1).stall_seconds(), 0.125);
  EXPECT_EQ(h->nvme_bytes_read(), 40u);
  EXPECT_EQ(h->nvme_bytes_written(), 80u);
  EXPECT_FALSE(histories.Get("b").has_value());
  histories.Remove("a");
  EXPECT_FALSE(histories.Get("a").has_value());
}

TEST(JobHistoriesTest, BoundedWhateverTheRunLength) {
  JobHistories histories(32);
  for (uint64_t step = 1; step <= 5000; ++step) {
    histories.Record("a", Report(step, 1.0 / static_cast<double>(step)), static_cast<double>(step),
                     static_cast<int64_t>(step));
  }
  const std::optional<v1::JobHistory> h = histories.Get("a");
  ASSERT_TRUE(h.has_value());
  EXPECT_LE(h->steps_size(), 32);
  EXPECT_LE(h->validation_size(), 32);
  EXPECT_EQ(h->steps(h->steps_size() - 1).step(), 5000u);
  EXPECT_GE(h->stride(), 128u);
}

TEST(JobHistoriesTest, StepsWithoutLayerTimingsKeepTheLastOnes) {
  JobHistories histories;
  histories.Record("a", Report(1, 1.0), 1.0, 1);
  engine::StepReport bare = Report(2, 1.0);
  bare.layers.clear();
  histories.Record("a", bare, 1.0, 2);
  EXPECT_EQ(histories.Get("a")->layers_step(), 1u);
  EXPECT_EQ(histories.Get("a")->layers_size(), 3);
}

}  // namespace
}  // namespace megatrain::server
