// Tests for ThreadPool: coverage of every task, blocking semantics, nesting.
#include "engine/common/thread_pool.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <numeric>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace megatrain::engine {
namespace {

TEST(ThreadPoolTest, ParallelForRunsEveryTaskExactlyOnce) {
  for (size_t threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (size_t n : {0, 1, 2, 7, 1001}) {
      std::vector<int> hits(n, 0);
      pool.ParallelFor(n, [&](size_t task) { ++hits[task]; });
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i], 1) << "threads=" << threads << " i=" << i;
    }
  }
}

TEST(ThreadPoolTest, ParallelForRunsTasksConcurrentlyOnWorkers) {
  ThreadPool pool(2);
  std::mutex mu;
  std::condition_variable cv;
  std::set<std::thread::id> ids;
  int arrived = 0;
  bool all_met = true;
  // Each task waits (bounded) until the other has started: both can only
  // meet if they run at the same time on different workers.
  pool.ParallelFor(2, [&](size_t) {
    std::unique_lock<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
    ++arrived;
    cv.notify_all();
    if (!cv.wait_for(lock, std::chrono::seconds(20), [&] { return arrived == 2; })) {
      all_met = false;
    }
  });
  EXPECT_TRUE(all_met);
  EXPECT_EQ(ids.size(), 2u);
  EXPECT_EQ(ids.count(std::this_thread::get_id()), 0u);
}

TEST(ThreadPoolTest, SubmitAndWait) {
  ThreadPool pool(2);
  int value = 0;
  TaskHandle handle = pool.Submit([&] { value = 42; });
  handle.Wait();
  EXPECT_TRUE(handle.Done());
  EXPECT_EQ(value, 42);
  handle.Wait();  // second wait is a no-op
}

TEST(ThreadPoolTest, HandleDestructorWaits) {
  ThreadPool pool(1);
  std::vector<int> out(100, 0);
  {
    TaskHandle handle = pool.SubmitParallelFor(out.size(), [&](size_t i) { out[i] = int(i); });
  }
  std::vector<int> expected(100);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(out, expected);
}

TEST(ThreadPoolTest, MoveAssignWaitsForPreviousWork) {
  ThreadPool pool(2);
  int a = 0, b = 0;
  TaskHandle handle = pool.Submit([&] { a = 1; });
  handle = pool.Submit([&] { b = 2; });
  EXPECT_EQ(a, 1);
  handle.Wait();
  EXPECT_EQ(b, 2);
  TaskHandle empty;
  EXPECT_TRUE(empty.Done());
  empty.Wait();
}

TEST(ThreadPoolTest, NestedParallelForOnEveryWorkerDoesNotDeadlock) {
  for (size_t threads : {1, 2}) {
    ThreadPool pool(threads);
    std::vector<std::vector<int>> hits(4, std::vector<int>(33, 0));
    pool.ParallelFor(hits.size(), [&](size_t outer) {
      pool.ParallelFor(hits[outer].size(), [&](size_t inner) { ++hits[outer][inner]; });
    });
    for (const auto& row : hits) {
      for (int h : row) ASSERT_EQ(h, 1);
    }
  }
}

TEST(ThreadPoolTest, ManySubmissionsFromOneCallerAllComplete) {
  ThreadPool pool(2);
  std::vector<int> out(257, 0);
  std::vector<TaskHandle> handles;
  for (size_t i = 0; i < out.size(); ++i) {
    handles.push_back(pool.Submit([&out, i] { out[i] = int(i) * 3; }));
  }
  for (TaskHandle& h : handles) h.Wait();
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], int(i) * 3);
}

}  // namespace
}  // namespace megatrain::engine
