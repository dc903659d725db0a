// Tests for CpuDevice: stream order, events across streams, faults, arena, pinned budget,
// timeline.
#include "engine/device/cpu_device.h"

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "engine/device/device_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::engine {
namespace {

using ::megatrain::engine::testing::SynchronizeWithin;
using ::testing::HasSubstr;

constexpr absl::Duration kMustNotHappenWindow = absl::Milliseconds(100);
constexpr absl::Duration kBoundedWait = absl::Seconds(30);

std::unique_ptr<CpuDevice> MakeDevice(size_t arena_bytes = 1 << 20, size_t pinned = 1 << 20) {
  DeviceOptions options;
  options.arena_bytes = arena_bytes;
  options.pinned_budget_bytes = pinned;
  absl::StatusOr<std::unique_ptr<CpuDevice>> device = CpuDevice::Create(options);
  EXPECT_TRUE(device.ok()) << device.status();
  return std::move(*device);
}

std::unique_ptr<Stream> MakeStream(Device& device, std::string name) {
  absl::StatusOr<std::unique_ptr<Stream>> stream = device.CreateStream(std::move(name));
  EXPECT_TRUE(stream.ok()) << stream.status();
  return std::move(*stream);
}

std::unique_ptr<Event> MakeEvent(Device& device) {
  absl::StatusOr<std::unique_ptr<Event>> event = device.CreateEvent();
  EXPECT_TRUE(event.ok()) << event.status();
  return std::move(*event);
}

TEST(CpuDeviceTest, CreateRejectsBadOptionsNamingTheField) {
  DeviceOptions options;
  options.arena_bytes = 0;
  EXPECT_THAT(CpuDevice::Create(options).status().ToString(), HasSubstr("arena_bytes"));
  options.arena_bytes = 4096;
  options.link_gbps = -1;
  EXPECT_THAT(CpuDevice::Create(options).status().ToString(), HasSubstr("link_gbps"));
  options.link_gbps = 0;
  options.kind = DeviceKind::kCuda;
  EXPECT_EQ(CpuDevice::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.kind = DeviceKind::kCpu;
  auto device = CpuDevice::Create(options);
  ASSERT_TRUE(device.ok());
  EXPECT_EQ((*device)->CreateStream("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CpuDeviceTest, StreamRunsItsQueueInOrder) {
  auto device = MakeDevice();
  auto stream = MakeStream(*device, "compute");
  std::vector<int> seen;  // touched only by the stream's worker until Synchronize returns
  constexpr int kTasks = 2001;
  for (int i = 0; i < kTasks; ++i) stream->EnqueueHostTask([&seen, i] { seen.push_back(i); });
  ASSERT_TRUE(SynchronizeWithin(*stream).ok());
  std::vector<int> expected(kTasks);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(seen, expected);
}

TEST(CpuDeviceTest, CopiesRoundTripThroughDeviceMemory) {
  auto device = MakeDevice();
  auto stream = MakeStream(*device, "copy");
  constexpr size_t kBytes = 100003;
  std::vector<uint8_t> source(kBytes);
  for (size_t i = 0; i < kBytes; ++i) source[i] = static_cast<uint8_t>(i * 131 + 7);
  DeviceBuffer first = *device->Allocate(kBytes, "first");
  DeviceBuffer second = *device->Allocate(kBytes, "second");
  absl::StatusOr<PinnedHostBuffer> back = device->AllocatePinned(kBytes);
  ASSERT_TRUE(back.ok()) << back.status();
  stream->CopyHostToDevice(first.data(), source.data(), kBytes);
  stream->CopyDeviceToDevice(second.data(), first.data(), kBytes);
  stream->CopyDeviceToHost(back->data(), second.data(), kBytes);
  ASSERT_TRUE(SynchronizeWithin(*stream).ok());
  EXPECT_EQ(std::memcmp(back->data(), source.data(), kBytes), 0);
}

TEST(CpuDeviceTest, CopyOutsideTheArenaIsAStickyStreamError) {
  auto device = MakeDevice();
  auto stream = MakeStream(*device, "copy");
  std::vector<uint8_t> host(64), not_device(64);
  stream->CopyHostToDevice(not_device.data(), host.data(), host.size());
  bool later_ran = false;
  stream->EnqueueHostTask([&later_ran] { later_ran = true; });
  const absl::Status status = SynchronizeWithin(*stream);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.ToString(), HasSubstr("not inside the device arena"));
  EXPECT_FALSE(later_ran);
  EXPECT_TRUE(device->health().ok());  // a misuse, not a device fault
}

// Stream B's task depends (through an event) on stream A's task, which is held on a latch the
// test releases later: B must not run before, and must see A's write after.
TEST(CpuDeviceTest, WaitEventOrdersWorkAcrossStreams) {
  auto device = MakeDevice();
  auto a = MakeStream(*device, "a");
  auto b = MakeStream(*device, "b");
  auto ready = MakeEvent(*device);
  absl::Notification release_a, b_reached_wait, b_ran;
  int shared = 0;
  int observed = -1;

  a->EnqueueHostTask([&] {
    ASSERT_TRUE(release_a.WaitForNotificationWithTimeout(kBoundedWait));
    shared = 42;
  });
  a->RecordEvent(*ready);
  b->EnqueueHostTask([&] { b_reached_wait.Notify(); });
  b->WaitEvent(*ready, {.label = "wait for a"});
  b->EnqueueHostTask([&] {
    observed = shared;
    b_ran.Notify();
  });

  ASSERT_TRUE(b_reached_wait.WaitForNotificationWithTimeout(kBoundedWait));
  EXPECT_FALSE(b_ran.WaitForNotificationWithTimeout(kMustNotHappenWindow));
  EXPECT_FALSE(ready->Query());
  release_a.Notify();
  ASSERT_TRUE(SynchronizeWithin(*b).ok());
  EXPECT_EQ(observed, 42);
  EXPECT_TRUE(ready->Query());
  EXPECT_TRUE(ready->Synchronize().ok());
  EXPECT_TRUE(SynchronizeWithin(*a).ok());
}

TEST(CpuDeviceTest, WaitingOnANeverRecordedEventIsANoOp) {
  auto device = MakeDevice();
  auto stream = MakeStream(*device, "s");
  auto never = MakeEvent(*device);
  EXPECT_TRUE(never->Query());
  EXPECT_TRUE(never->Synchronize().ok());
  bool ran = false;
  stream->WaitEvent(*never);
  stream->EnqueueHostTask([&ran] { ran = true; });
  ASSERT_TRUE(SynchronizeWithin(*stream).ok());
  EXPECT_TRUE(ran);
}

TEST(CpuDeviceTest, RecordingAgainMovesTheEventToTheNewPoint) {
  auto device = MakeDevice();
  auto a = MakeStream(*device, "a");
  auto b = MakeStream(*device, "b");
  auto event = MakeEvent(*device);
  a->RecordEvent(*event);
  ASSERT_TRUE(event->Synchronize().ok());  // first point completed

  absl::Notification release_a, b_ran;
  a->EnqueueHostTask([&] { ASSERT_TRUE(release_a.WaitForNotificationWithTimeout(kBoundedWait)); });
  a->RecordEvent(*event);  // now refers to the point after the blocked task
  b->WaitEvent(*event);
  b->EnqueueHostTask([&] { b_ran.Notify(); });
  EXPECT_FALSE(b_ran.WaitForNotificationWithTimeout(kMustNotHappenWindow));
  EXPECT_FALSE(event->Query());
  release_a.Notify();
  EXPECT_TRUE(b_ran.WaitForNotificationWithTimeout(kBoundedWait));
  EXPECT_TRUE(SynchronizeWithin(*b).ok());
  EXPECT_TRUE(SynchronizeWithin(*a).ok());
}

TEST(CpuDeviceTest, InjectedFaultIsStickyOnEveryStreamAndNothingHangs) {
  auto device = MakeDevice();
  auto a = MakeStream(*device, "a");
  auto b = MakeStream(*device, "b");
  auto event = MakeEvent(*device);
  int before = 0;
  a->EnqueueHostTask([&before] { before = 1; });
  ASSERT_TRUE(SynchronizeWithin(*a).ok());
  EXPECT_EQ(before, 1);

  device->InjectFault("uncorrectable ECC error");
  bool after_ran = false;
  a->EnqueueHostTask([&after_ran] { after_ran = true; });
  a->RecordEvent(*event);
  b->WaitEvent(*event);  // must still be released: record/wait survive the fault
  b->EnqueueHostTask([&after_ran] { after_ran = true; });

  const absl::Status on_a = SynchronizeWithin(*a);
  const absl::Status on_b = SynchronizeWithin(*b);
  EXPECT_FALSE(after_ran);
  EXPECT_EQ(on_a.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(on_a.ToString(), HasSubstr("uncorrectable ECC error"));
  EXPECT_EQ(on_b, on_a);
  EXPECT_EQ(device->health(), on_a);
  EXPECT_EQ(event->Synchronize(), on_a);

  auto later = MakeStream(*device, "later");
  later->EnqueueHostTask([&after_ran] { after_ran = true; });
  EXPECT_EQ(SynchronizeWithin(*later), on_a);
  EXPECT_FALSE(after_ran);
}

TEST(CpuDeviceTest, FailedHostTaskIsStickyForItsStreamOnly) {
  auto device = MakeDevice();
  auto failing = MakeStream(*device, "failing");
  auto healthy = MakeStream(*device, "healthy");
  failing->EnqueueFallibleHostTask([] { return absl::DataLossError("bad shard"); });
  bool skipped_ran = false, other_ran = false;
  failing->EnqueueHostTask([&skipped_ran] { skipped_ran = true; });
  healthy->EnqueueHostTask([&other_ran] { other_ran = true; });
  const absl::Status status = SynchronizeWithin(*failing);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.ToString(), HasSubstr("stream 'failing'"));
  EXPECT_THAT(status.ToString(), HasSubstr("bad shard"));
  EXPECT_FALSE(skipped_ran);
  EXPECT_TRUE(SynchronizeWithin(*healthy).ok());
  EXPECT_TRUE(other_ran);
  EXPECT_TRUE(device->health().ok());
}

TEST(CpuDeviceTest, DestroyingAStreamRunsWhatWasQueued) {
  auto device = MakeDevice();
  int count = 0;
  {
    auto stream = MakeStream(*device, "short-lived");
    for (int i = 0; i < 97; ++i) stream->EnqueueHostTask([&count] { ++count; });
  }
  EXPECT_EQ(count, 97);
}

TEST(CpuDeviceTest, ArenaFillsExactlyAndReportsTheNumbersWhenFull) {
  constexpr size_t kCapacity = 64 * 1024 + 100;
  auto device = MakeDevice(kCapacity);
  EXPECT_EQ(device->arena_stats().capacity, kCapacity);
  absl::StatusOr<DeviceBuffer> all = device->Allocate(kCapacity, "everything");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), kCapacity);
  absl::StatusOr<DeviceBuffer> more = device->Allocate(1, "straw");
  ASSERT_FALSE(more.ok());
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  for (const char* part : {"requested 1 bytes", "'straw'", "capacity 65636", "in use 65636",
                           "largest free block 0", "device 'cpu'"}) {
    EXPECT_THAT(more.status().ToString(), HasSubstr(part));
  }
  all->Reset();
  EXPECT_EQ(device->arena_stats().in_use, 0u);
  EXPECT_EQ(device->arena_stats().peak, kCapacity);
}

TEST(CpuDeviceTest, FreedNeighboursCoalesceAndPeakIsTracked) {
  constexpr size_t kBlock = 10 * 1024 + 3;  // footprint 10496
  constexpr size_t kFootprint = 10496;
  auto device = MakeDevice(3 * kFootprint);
  std::vector<DeviceBuffer> blocks;
  for (int i = 0; i < 3; ++i) blocks.push_back(*device->Allocate(kBlock, "block"));
  for (const DeviceBuffer& block : blocks) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(block.data()) % 256, 0u);
  }
  EXPECT_EQ(device->arena_stats().allocations, 3u);
  EXPECT_FALSE(device->Allocate(1, "full").ok());
  blocks[0].Reset();
  blocks[2].Reset();
  EXPECT_FALSE(device->Allocate(2 * kFootprint, "fragmented").ok());
  blocks[1].Reset();
  absl::StatusOr<DeviceBuffer> big = device->Allocate(3 * kFootprint, "whole");
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(device->arena_stats().peak, 3 * kFootprint);
  big->Reset();
  device->ResetPeak();
  EXPECT_EQ(device->arena_stats().peak, 0u);
  DeviceBuffer moved = *device->Allocate(kBlock, "moved");
  DeviceBuffer target = std::move(moved);
  EXPECT_TRUE(moved.empty());
  EXPECT_EQ(device->arena_stats().allocations, 1u);
  EXPECT_EQ(device->arena_stats().peak, kFootprint);
  absl::StatusOr<DeviceBuffer> nothing = device->Allocate(0, "nothing");
  ASSERT_TRUE(nothing.ok());
  EXPECT_TRUE(nothing->empty());
  EXPECT_EQ(device->arena_stats().allocations, 1u);
}

TEST(CpuDeviceTest, PinnedMemoryIsCountedAgainstItsBudget) {
  constexpr size_t kBudget = (1 << 20) + 5;
  auto device = MakeDevice(4096, kBudget);
  absl::StatusOr<PinnedHostBuffer> most = device->AllocatePinned(1 << 20);
  ASSERT_TRUE(most.ok()) << most.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(most->data()) % 64, 0u);
  std::memset(most->data(), 0xab, most->size());
  absl::StatusOr<PinnedHostBuffer> over = device->AllocatePinned(6);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  for (const char* part : {"requested 6 bytes", "budget 1048581", "in use 1048576"}) {
    EXPECT_THAT(over.status().ToString(), HasSubstr(part));
  }
  absl::StatusOr<PinnedHostBuffer> fits = device->AllocatePinned(5);
  ASSERT_TRUE(fits.ok());
  EXPECT_EQ(device->pinned_stats().in_use, kBudget);
  most->Reset();
  fits->Reset();
  EXPECT_EQ(device->pinned_stats().in_use, 0u);
  EXPECT_EQ(device->pinned_stats().peak, kBudget);
  EXPECT_EQ(device->pinned_stats().allocations, 0u);
  EXPECT_TRUE(device->AllocatePinned(1 << 20).ok());
}

// `ulimit -l` is often 8 MiB: a larger pinned buffer must still work (as pageable memory, with
// one warning) and be counted against the budget all the same.
TEST(CpuDeviceTest, PinnedMemoryBeyondTheMlockLimitDegradesButWorks) {
  constexpr size_t kBytes = (12 << 20) + 77;
  auto device = MakeDevice(4096, 2 * kBytes);
  absl::StatusOr<PinnedHostBuffer> first = device->AllocatePinned(kBytes);
  absl::StatusOr<PinnedHostBuffer> second = device->AllocatePinned(kBytes);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  std::memset(first->data(), 1, kBytes);
  std::memset(second->data(), 2, kBytes);
  EXPECT_EQ(first->data_as<uint8_t>()[kBytes - 1], 1);
  EXPECT_EQ(device->pinned_stats().in_use, 2 * kBytes);
  RecordProperty("mlock_degraded", device->pinned_mlock_degraded() ? "yes" : "no");
}

TEST(CpuDeviceTest, ZeroPinnedBudgetAllowsNoPinnedMemory) {
  auto device = MakeDevice(4096, 0);
  EXPECT_EQ(device->AllocatePinned(1).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(CpuDeviceTest, TimelineIsOffByDefault) {
  auto device = MakeDevice();
  auto stream = MakeStream(*device, "s");
  stream->EnqueueHostTask([] {}, {.kind = SpanKind::kCompute, .label = "x"});
  ASSERT_TRUE(SynchronizeWithin(*stream).ok());
  EXPECT_TRUE(device->timeline().Spans().empty());
}

TEST(CpuDeviceTest, TimelineRecordsTaggedSpansAndWaitsAndExportsChromeJson) {
  auto device = MakeDevice(1 << 20);
  device->timeline().set_enabled(true);
  auto copy_in = MakeStream(*device, "copy_in");
  auto compute = MakeStream(*device, "compute");
  auto weights_ready = MakeEvent(*device);
  constexpr size_t kBytes = 300007;
  std::vector<uint8_t> host(kBytes, 3);
  DeviceBuffer slot = *device->Allocate(kBytes, "slot");
  absl::Notification release_copy;

  copy_in->EnqueueHostTask(
      [&] { ASSERT_TRUE(release_copy.WaitForNotificationWithTimeout(kBoundedWait)); },
      {.kind = SpanKind::kOther, .label = "gate"});
  copy_in->CopyHostToDevice(slot.data(), host.data(), kBytes,
                            {.kind = SpanKind::kCopyIn, .label = "weights", .layer = 5});
  copy_in->RecordEvent(*weights_ready);
  absl::Notification compute_at_wait;
  compute->EnqueueHostTask([&] { compute_at_wait.Notify(); }, {.label = "marker"});
  compute->WaitEvent(*weights_ready, {.label = "weights L5", .layer = 5});
  uint64_t sum = 0;
  compute->EnqueueHostTask(
      [&] {
        for (size_t i = 0; i < kBytes; ++i) sum += slot.data_as<uint8_t>()[i];
      },
      {.kind = SpanKind::kCompute, .label = "layer", .layer = 5});
  // Open the gate only once the compute stream is at its wait, so the wait really blocks.
  ASSERT_TRUE(compute_at_wait.WaitForNotificationWithTimeout(kBoundedWait));
  release_copy.Notify();
  ASSERT_TRUE(SynchronizeWithin(*compute).ok());
  ASSERT_TRUE(SynchronizeWithin(*copy_in).ok());
  EXPECT_EQ(sum, 3u * kBytes);

  const std::vector<TimelineSpan> spans = device->timeline().Spans();
  std::map<std::string, TimelineSpan> by_label;
  for (const TimelineSpan& span : spans) {
    EXPECT_LE(span.begin_ns, span.end_ns) << span.label;
    by_label[span.label] = span;
  }
  ASSERT_EQ(by_label.count("weights"), 1u);
  ASSERT_EQ(by_label.count("weights L5"), 1u);
  ASSERT_EQ(by_label.count("layer"), 1u);
  const TimelineSpan& copy = by_label["weights"];
  const TimelineSpan& wait = by_label["weights L5"];
  const TimelineSpan& layer = by_label["layer"];
  EXPECT_EQ(copy.stream, "copy_in");
  EXPECT_EQ(copy.kind, SpanKind::kCopyIn);
  EXPECT_EQ(copy.layer, 5);
  EXPECT_LT(copy.begin_ns, copy.end_ns);
  EXPECT_EQ(wait.stream, "compute");
  EXPECT_EQ(wait.kind, SpanKind::kWait);
  EXPECT_LE(wait.end_ns, layer.begin_ns);
  EXPECT_GE(wait.end_ns, copy.end_ns);  // released only after the copy finished
  EXPECT_EQ(layer.kind, SpanKind::kCompute);
  EXPECT_LT(layer.begin_ns, layer.end_ns);
  EXPECT_LE(copy.end_ns, layer.begin_ns);
  EXPECT_GT(device->timeline().TotalNs("compute", SpanKind::kWait), 0);

  const nlohmann::json trace = nlohmann::json::parse(device->timeline().ToChromeTraceJson());
  std::set<std::string> categories;
  for (const nlohmann::json& event : trace.at("traceEvents")) {
    if (event.at("ph") == "X") {
      categories.insert(event.at("cat").get<std::string>());
      EXPECT_GE(event.at("dur").get<double>(), 0.0);
    }
  }
  EXPECT_EQ(categories, (std::set<std::string>{"copy_in", "compute", "wait", "other"}));
}

TEST(CpuDeviceDeathTest, BufferOutlivingItsDeviceIsCaughtInDebugBuilds) {
#ifdef NDEBUG
  GTEST_SKIP() << "the check is debug-only";
#else
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto device = MakeDevice();
        DeviceBuffer leaked = *device->Allocate(1000, "leaked.activations");
        device.reset();
      },
      "leaked.activations");
#endif
}

}  // namespace
}  // namespace megatrain::engine
