// Tests for CudaDevice; without a usable GPU they skip with "no CUDA device: <cuda error>".
#include "engine/device/cuda_device.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "engine/device/cuda_stream.h"
#include "engine/device/device_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::engine {
namespace {

using ::megatrain::engine::testing::SynchronizeWithin;
using ::testing::HasSubstr;

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DeviceOptions options;
    options.kind = DeviceKind::kCuda;
    options.arena_bytes = 64 << 20;
    options.pinned_budget_bytes = 16 << 20;
    absl::StatusOr<std::unique_ptr<CudaDevice>> device = CudaDevice::Create(options);
    if (!device.ok()) {
      ASSERT_EQ(device.status().code(), absl::StatusCode::kFailedPrecondition) << device.status();
      ASSERT_TRUE(absl::StartsWith(device.status().message(), "no CUDA device: "))
          << device.status();
      GTEST_SKIP() << device.status().message();
    }
    device_ = std::move(*device);
  }

  std::unique_ptr<CudaDevice> device_;
};

TEST_F(CudaDeviceTest, CopiesRoundTripAndHostTasksRunInOrder) {
  auto stream = *device_->CreateStream("copy");
  constexpr size_t kBytes = 100003;
  std::vector<uint8_t> source(kBytes);
  for (size_t i = 0; i < kBytes; ++i) source[i] = static_cast<uint8_t>(i * 31 + 1);
  DeviceBuffer first = *device_->Allocate(kBytes, "first");
  DeviceBuffer second = *device_->Allocate(kBytes, "second");
  PinnedHostBuffer back = *device_->AllocatePinned(kBytes);
  std::vector<int> order;
  stream->CopyHostToDevice(first.data(), source.data(), kBytes);
  stream->EnqueueHostTask([&order] { order.push_back(1); });
  stream->CopyDeviceToDevice(second.data(), first.data(), kBytes);
  stream->CopyDeviceToHost(back.data(), second.data(), kBytes);
  stream->EnqueueHostTask([&order] { order.push_back(2); });
  ASSERT_TRUE(SynchronizeWithin(*stream).ok());
  EXPECT_EQ(std::memcmp(back.data(), source.data(), kBytes), 0);
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  EXPECT_NE(static_cast<CudaStream*>(stream.get())->native_handle(), nullptr);
}

TEST_F(CudaDeviceTest, EventsOrderStreams) {
  auto a = *device_->CreateStream("a");
  auto b = *device_->CreateStream("b");
  auto event = *device_->CreateEvent();
  int shared = 0, observed = -1;
  a->EnqueueHostTask([&shared] { shared = 7; });
  a->RecordEvent(*event);
  b->WaitEvent(*event);
  b->EnqueueHostTask([&] { observed = shared; });
  ASSERT_TRUE(SynchronizeWithin(*b).ok());
  EXPECT_EQ(observed, 7);
  EXPECT_TRUE(event->Query());
}

// With host-task lanes, a host task that blocks holds only its own stream: another stream's
// host task still runs (on the driver's one callback thread the two could serialise, and the
// first would wait forever for the second; the bound turns that into a failure). The promise
// outlives the streams, whose destructors drain them.
TEST_F(CudaDeviceTest, ABlockedHostTaskHoldsOnlyItsOwnStream) {
  std::promise<void> b_ran;
  std::future<void> b_done = b_ran.get_future();
  std::atomic<bool> a_saw_b{false};
  auto a = *device_->CreateStream("a");
  auto b = *device_->CreateStream("b");
  auto* cuda_a = static_cast<CudaStream*>(a.get());
  if (!cuda_a->has_host_task_lane()) {
    GTEST_SKIP() << "host tasks use the callback thread: " << cuda_a->host_task_lane_status();
  }
  a->EnqueueHostTask([&] {
    a_saw_b = b_done.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  });
  b->EnqueueHostTask([&b_ran] { b_ran.set_value(); });
  ASSERT_TRUE(SynchronizeWithin(*b).ok());
  ASSERT_TRUE(SynchronizeWithin(*a).ok());
  EXPECT_TRUE(a_saw_b.load());
}

// What a host task writes is what the stream's later work reads: the stream waits for the task
// (with a lane, on the word the lane writes). The task sleeps so that a stream that did not wait
// would copy the old value; an event behind the task stays pending while it runs.
void ExpectLaterWorkWaitsForTheHostTask(Device& device) {
  auto stream = *device.CreateStream("ordered");
  auto after = *device.CreateEvent();
  PinnedHostBuffer word = *device.AllocatePinned(sizeof(uint32_t));
  PinnedHostBuffer back = *device.AllocatePinned(sizeof(uint32_t));
  DeviceBuffer on_device = *device.Allocate(sizeof(uint32_t), "word");
  *static_cast<uint32_t*>(word.data()) = 1;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  stream->EnqueueHostTask([&word, released] {
    released.wait_for(std::chrono::seconds(20));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    *static_cast<volatile uint32_t*>(word.data()) = 2;
  });
  stream->CopyHostToDevice(on_device.data(), word.data(), sizeof(uint32_t));
  stream->CopyDeviceToHost(back.data(), on_device.data(), sizeof(uint32_t));
  stream->RecordEvent(*after);
  EXPECT_FALSE(after->Query()) << "work behind a blocked host task ran";
  release.set_value();
  ASSERT_TRUE(SynchronizeWithin(*stream).ok());
  EXPECT_EQ(*static_cast<uint32_t*>(back.data()), 2u);
}

TEST_F(CudaDeviceTest, LaterWorkWaitsForTheHostTask) {
  ExpectLaterWorkWaitsForTheHostTask(*device_);
}

// The same on the driver's callback thread (cuda_host_task_threads off): the old path stays
// tested on drivers that have lanes.
TEST_F(CudaDeviceTest, LaterWorkWaitsForTheHostTaskOnTheCallbackThread) {
  DeviceOptions options;
  options.kind = DeviceKind::kCuda;
  options.arena_bytes = 16 << 20;
  options.pinned_budget_bytes = 1 << 20;
  options.cuda_host_task_threads = false;
  std::unique_ptr<CudaDevice> callbacks = *CudaDevice::Create(options);
  auto probe = *callbacks->CreateStream("probe");
  EXPECT_FALSE(static_cast<CudaStream*>(probe.get())->has_host_task_lane());
  ExpectLaterWorkWaitsForTheHostTask(*callbacks);
}

// Review point 3: copies, waits and EnqueueTimed work add timeline spans (timing events,
// resolved by Synchronize), in stream order and inside the host-clock window of the work.
TEST_F(CudaDeviceTest, CopiesWaitsAndTimedWorkAddTimelineSpans) {
  auto copy = *device_->CreateStream("copy_in");
  auto compute = *device_->CreateStream("compute");
  auto* cuda_compute = dynamic_cast<CudaStream*>(compute.get());
  ASSERT_NE(cuda_compute, nullptr);
  auto event = *device_->CreateEvent();
  constexpr size_t kBytes = 8 << 20;
  PinnedHostBuffer host = *device_->AllocatePinned(kBytes);
  DeviceBuffer dev = *device_->Allocate(kBytes, "x");
  device_->timeline().set_enabled(true);
  const int64_t before_ns = device_->timeline().NowNs();
  copy->CopyHostToDevice(dev.data(), host.data(), kBytes, {SpanKind::kCopyIn, "weights", 2});
  copy->RecordEvent(*event);
  compute->WaitEvent(*event, {SpanKind::kWait, "wait weights", 2});
  ASSERT_TRUE(cuda_compute
                  ->EnqueueTimed({SpanKind::kCompute, "layer 2", 2},
                                 [&](cudaStream_t s) {
                                   return cudaMemsetAsync(dev.data(), 0, kBytes, s) == cudaSuccess
                                              ? absl::OkStatus()
                                              : absl::InternalError("cudaMemsetAsync");
                                 })
                  .ok());
  ASSERT_TRUE(SynchronizeWithin(*copy).ok());
  ASSERT_TRUE(SynchronizeWithin(*compute).ok());
  const int64_t after_ns = device_->timeline().NowNs();
  device_->timeline().set_enabled(false);
  const std::vector<TimelineSpan> spans = device_->timeline().Spans();
  ASSERT_EQ(spans.size(), 3u);
  int64_t copy_end = 0;
  for (const TimelineSpan& span : spans) {
    EXPECT_EQ(span.layer, 2);
    // The anchor's host time is read just after it completes: allow a millisecond of slack.
    EXPECT_GE(span.begin_ns, before_ns - 1000000) << span.label;
    EXPECT_LE(span.end_ns, after_ns + 1000000) << span.label;
    EXPECT_LE(span.begin_ns, span.end_ns) << span.label;
    if (span.kind == SpanKind::kCopyIn) {
      EXPECT_EQ(span.stream, "copy_in");
      EXPECT_GT(span.end_ns, span.begin_ns) << "8 MiB takes time";
      copy_end = span.end_ns;
    }
  }
  for (const TimelineSpan& span : spans) {
    if (span.kind == SpanKind::kCompute) {
      EXPECT_EQ(span.stream, "compute");
      EXPECT_GE(span.begin_ns + 100000, copy_end) << "compute waited for the copy";
    }
  }
  EXPECT_EQ(cuda_compute->spans().pending(), 0u);
}

// Review point 8: host waits sleep. The fixture's device asked for blocking sync; where the
// flags could not be set (the process's primary context came first), the status says why.
TEST_F(CudaDeviceTest, HostWaitsUseBlockingSync) {
  if (!device_->blocking_sync_status().ok()) {
    GTEST_SKIP() << "blocking sync not set: " << device_->blocking_sync_status();
  }
  unsigned int flags = 0;
  ASSERT_EQ(cudaGetDeviceFlags(&flags), cudaSuccess);
  EXPECT_EQ(flags & cudaDeviceScheduleMask, cudaDeviceScheduleBlockingSync);
}

TEST_F(CudaDeviceTest, ArenaAndPinnedBudgetAreEnforced) {
  absl::StatusOr<DeviceBuffer> all = device_->Allocate(64 << 20, "all");
  ASSERT_TRUE(all.ok()) << all.status();
  absl::StatusOr<DeviceBuffer> more = device_->Allocate(1, "more");
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(more.status().ToString(), HasSubstr("largest free block 0"));
  EXPECT_EQ(device_->AllocatePinned((16 << 20) + 1).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(device_->health().ok());
}

TEST(CudaErrorTest, StickyErrorsAreClassified) {
  EXPECT_TRUE(IsStickyCudaError(cudaErrorIllegalAddress));
  EXPECT_TRUE(IsStickyCudaError(cudaErrorLaunchFailure));
  EXPECT_FALSE(IsStickyCudaError(cudaErrorMemoryAllocation));
  EXPECT_FALSE(IsStickyCudaError(cudaErrorNotReady));
  EXPECT_EQ(CudaErrorToStatus(cudaErrorMemoryAllocation, "x").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(CudaErrorToStatus(cudaSuccess, "x").ok());
}

TEST(CudaDeviceStateTest, AStickyErrorMakesTheDeviceUnhealthyForever) {
  CudaDeviceState state(0, "cuda:0 (test)");
  EXPECT_EQ(state.Check(cudaErrorMemoryAllocation, "cudaMalloc").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(state.fault().ok());
  const absl::Status sticky = state.Check(cudaErrorIllegalAddress, "kernel");
  EXPECT_EQ(state.fault(), sticky);
  EXPECT_THAT(sticky.ToString(), HasSubstr("cudaErrorIllegalAddress"));
  (void)state.Check(cudaErrorLaunchFailure, "later kernel");
  EXPECT_EQ(state.fault(), sticky);  // the first fault wins
}

}  // namespace
}  // namespace megatrain::engine
