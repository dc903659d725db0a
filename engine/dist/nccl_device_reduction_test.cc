// NcclDeviceReduction as the executors drive it: one CudaDevice and copy_out stream per GPU, each
// rank's in-place reduce-scatter enqueued from a thread of its own (the device's lane), the
// shard against the double-precision sum with the bound any fp32 order keeps to (the input's
// bits for one GPU). With two GPUs, a rank left alone in a reduce-scatter is released by Abort,
// or by its deadline, and the next step's Reset makes fresh communicators. Without a GPU:
// refusals only.
#include "engine/dist/nccl_device_reduction.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/device/cpu_device.h"
#include "engine/device/cuda_device.h"
#include "engine/dist/nccl_test_values.h"
#include "kernels/cuda/cuda_test_util.h"

namespace megatrain::engine::dist {
namespace {

using testing::Contribution;
using testing::FirstMiss;
using testing::Reference;
using testing::SumOverRanks;

int VisibleGpus() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

struct Gpu {
  std::unique_ptr<CudaDevice> device;
  std::unique_ptr<Stream> copy_out;
};

std::vector<Gpu> MakeGpus(int n) {
  std::vector<Gpu> gpus;
  for (int g = 0; g < n; ++g) {
    DeviceOptions options;
    options.kind = DeviceKind::kCuda;
    options.cuda_device_ordinal = g;
    options.arena_bytes = size_t{64} << 20;
    options.pinned_budget_bytes = size_t{16} << 20;
    absl::StatusOr<std::unique_ptr<CudaDevice>> device = CudaDevice::Create(options);
    EXPECT_TRUE(device.ok()) << device.status();
    if (!device.ok()) return {};
    absl::StatusOr<std::unique_ptr<Stream>> stream = (*device)->CreateStream("copy_out");
    EXPECT_TRUE(stream.ok()) << stream.status();
    if (!stream.ok()) return {};
    gpus.push_back({std::move(*device), std::move(*stream)});
  }
  return gpus;
}

std::vector<Device*> Pointers(const std::vector<Gpu>& gpus) {
  std::vector<Device*> devices;
  for (const Gpu& g : gpus) devices.push_back(g.device.get());
  return devices;
}

// Two GPUs as two lanes of one process, their reduction with `timeout` as the collective
// timeout, and a buffer of 2 x shard floats on each (reduction null when something failed).
struct TwoGpus {
  std::vector<Gpu> lanes;
  std::unique_ptr<NcclDeviceReduction> reduction;
  std::vector<DeviceBuffer> sums;
};

TwoGpus MakeTwoGpus(absl::Duration timeout, size_t shard) {
  TwoGpus two;
  two.lanes = MakeGpus(2);
  EXPECT_EQ(two.lanes.size(), 2u);
  if (two.lanes.size() != 2) return two;
  NcclOptions options;
  options.collective_timeout = timeout;
  auto reduction = NcclDeviceReduction::Create(Pointers(two.lanes), options);
  EXPECT_TRUE(reduction.ok()) << reduction.status();
  if (!reduction.ok()) return two;
  for (Gpu& lane : two.lanes) {
    EXPECT_TRUE(lane.device->MakeCurrent().ok());
    absl::StatusOr<DeviceBuffer> b = lane.device->Allocate(2 * shard * sizeof(float), "sums");
    EXPECT_TRUE(b.ok()) << b.status();
    if (!b.ok()) return two;
    two.sums.push_back(std::move(*b));
  }
  two.reduction = std::move(*reduction);
  return two;
}

TEST(NcclDeviceReductionTest, RefusesADeviceThatIsNotAGpu) {
  DeviceOptions options;
  options.arena_bytes = 1 << 20;
  absl::StatusOr<std::unique_ptr<CpuDevice>> cpu = CpuDevice::Create(options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto reduction = NcclDeviceReduction::Create({cpu->get()});
  ASSERT_FALSE(reduction.ok());
  EXPECT_EQ(reduction.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(reduction.status().message().find("devices[0] is not a CUDA device"), std::string::npos)
      << reduction.status();
}

TEST(NcclDeviceReductionTest, EachLaneGetsItsShardOfTheSumInPlace) {
  MT_SKIP_WITHOUT_CUDA();
  const int gpus = VisibleGpus();
  for (int world : gpus >= 2 ? std::vector<int>{1, 2} : std::vector<int>{1}) {
    std::vector<Gpu> lanes = MakeGpus(world);
    ASSERT_EQ(static_cast<int>(lanes.size()), world);
    auto reduction = NcclDeviceReduction::Create(Pointers(lanes));
    ASSERT_TRUE(reduction.ok()) << reduction.status();
    for (size_t n : {size_t{7}, size_t{4097}, (size_t{1} << 20) + 3}) {
      const size_t shard = ReductionShardElements(n, world);
      std::vector<DeviceBuffer> sums;
      for (int r = 0; r < world; ++r) {
        ASSERT_TRUE(lanes[r].device->MakeCurrent().ok());
        absl::StatusOr<DeviceBuffer> b =
            lanes[r].device->Allocate(shard * world * sizeof(float), "sums");
        ASSERT_TRUE(b.ok()) << b.status();
        std::vector<float> x = Contribution(r, n);
        x.resize(shard * world, 0.0f);
        lanes[r].copy_out->CopyHostToDevice(b->data(), x.data(), x.size() * sizeof(float), {});
        ASSERT_TRUE(lanes[r].copy_out->Synchronize().ok());
        sums.push_back(std::move(*b));
      }
      // Each rank from its own thread, outside any group, as each device's lane enqueues.
      std::vector<absl::Status> enqueued(world);
      std::vector<std::thread> threads;
      for (int r = 0; r < world; ++r) {
        threads.emplace_back([&, r] {
          enqueued[r] = lanes[r].device->MakeCurrent();
          if (!enqueued[r].ok()) return;
          enqueued[r] = (*reduction)
                            ->EnqueueReduceScatter(r, *lanes[r].copy_out, sums[r].data_as<float>(),
                                                   sums[r].data_as<float>() + r * shard, shard,
                                                   {SpanKind::kCopyOut, "reduce-scatter", -1});
        });
      }
      for (std::thread& t : threads) t.join();
      const Reference ref = SumOverRanks(world, n);
      for (int r = 0; r < world; ++r) {
        ASSERT_TRUE(enqueued[r].ok()) << "rank " << r << ": " << enqueued[r];
        std::vector<float> got(shard);
        ASSERT_TRUE(lanes[r].device->MakeCurrent().ok());
        lanes[r].copy_out->CopyDeviceToHost(got.data(), sums[r].data_as<float>() + r * shard,
                                            shard * sizeof(float), {});
        ASSERT_TRUE(lanes[r].copy_out->Synchronize().ok());
        EXPECT_EQ(FirstMiss(got, ref, static_cast<size_t>(r) * shard), -1)
            << "world " << world << ", n " << n << ", rank " << r;
      }
    }
  }
}

// Over the host communicator (one GPU per process; here the world of one, whose shard is the
// input's bits): the rank is the host's, any other is refused; after Abort, Reset does not form
// the world again (a collective only this rank would make): every later call says so.
TEST(NcclDeviceReductionTest, OverTheHostAWorldOfOneKeepsItsBitsAndStaysAbortedAfterAbort) {
  MT_SKIP_WITHOUT_CUDA();
  std::vector<Gpu> lanes = MakeGpus(1);
  ASSERT_EQ(lanes.size(), 1u);
  SingleProcessCommunicator host;
  auto reduction = NcclDeviceReduction::CreateOverHost(host, *lanes[0].device);
  ASSERT_TRUE(reduction.ok()) << reduction.status();
  EXPECT_EQ((*reduction)->world(), 1);
  const size_t n = 4097;
  absl::StatusOr<DeviceBuffer> b = lanes[0].device->Allocate(n * sizeof(float), "sums");
  ASSERT_TRUE(b.ok()) << b.status();
  const std::vector<float> x = Contribution(0, n);
  for (int round = 0; round < 2; ++round) {
    lanes[0].copy_out->CopyHostToDevice(b->data(), x.data(), n * sizeof(float), {});
    ASSERT_TRUE((*reduction)
                    ->EnqueueReduceScatter(0, *lanes[0].copy_out, b->data_as<float>(),
                                           b->data_as<float>(), n,
                                           {SpanKind::kCopyOut, "reduce-scatter", -1})
                    .ok());
    std::vector<float> got(n);
    lanes[0].copy_out->CopyDeviceToHost(got.data(), b->data_as<float>(), n * sizeof(float), {});
    ASSERT_TRUE(lanes[0].copy_out->Synchronize().ok());
    EXPECT_EQ(got, x) << "round " << round;
    (*reduction)->Reset();  // a healthy communicator stays as it is
  }
  float y = 0;
  const absl::Status other =
      (*reduction)->EnqueueReduceScatter(1, *lanes[0].copy_out, &y, &y, 1, {});
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument) << other;
  (*reduction)->Abort();
  (*reduction)->Reset();
  const absl::Status after = (*reduction)
                                 ->EnqueueReduceScatter(0, *lanes[0].copy_out, b->data_as<float>(),
                                                        b->data_as<float>(), n, {});
  EXPECT_EQ(after.code(), absl::StatusCode::kFailedPrecondition) << after;
  EXPECT_NE(after.message().find("resume from its last checkpoint"), std::string::npos) << after;
}

TEST(NcclDeviceReductionTest, RefusesOverTheHostADeviceThatIsNotAGpu) {
  DeviceOptions options;
  options.arena_bytes = 1 << 20;
  absl::StatusOr<std::unique_ptr<CpuDevice>> cpu = CpuDevice::Create(options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  SingleProcessCommunicator host;
  auto reduction = NcclDeviceReduction::CreateOverHost(host, **cpu);
  ASSERT_FALSE(reduction.ok());
  EXPECT_NE(reduction.status().message().find("rank 0's device is not a CUDA device"),
            std::string::npos)
      << reduction.status();
}

TEST(NcclDeviceReductionTest, AbortReleasesARankAloneAndResetMakesFreshCommunicators) {
  MT_SKIP_WITHOUT_CUDA();
  const int gpus = VisibleGpus();
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs for a peer, found " << gpus;
  const size_t shard = 1024;
  TwoGpus two = MakeTwoGpus(absl::Seconds(20), shard);
  ASSERT_NE(two.reduction, nullptr);
  std::vector<Gpu>& lanes = two.lanes;
  NcclDeviceReduction& reduction = *two.reduction;
  std::vector<DeviceBuffer>& sums = two.sums;
  // Rank 0 alone (rank 1's micro-batch failed before its reduce-scatter): Abort from rank 1's
  // thread must let rank 0's stream drain well before the collective timeout.
  ASSERT_TRUE(lanes[0].device->MakeCurrent().ok());
  (void)reduction.EnqueueReduceScatter(0, *lanes[0].copy_out, sums[0].data_as<float>(),
                                       sums[0].data_as<float>(), shard, {});
  std::thread aborter([&] { reduction.Abort(); });
  aborter.join();
  (void)lanes[0].copy_out->Synchronize();  // drains (its error, if any, is the step's)
  reduction.Reset();
  std::vector<absl::Status> enqueued(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      enqueued[r] = lanes[r].device->MakeCurrent();
      if (enqueued[r].ok()) {
        enqueued[r] =
            reduction.EnqueueReduceScatter(r, *lanes[r].copy_out, sums[r].data_as<float>(),
                                           sums[r].data_as<float>() + r * shard, shard, {});
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(enqueued[r].ok()) << "rank " << r << ": " << enqueued[r];
}

// A rank whose peer never joins (a hung GPU or process): once its reduce-scatter has started
// and not finished within collective_timeout, the deadline thread aborts the communicators, the
// stream drains, and Failure() says DEADLINE_EXCEEDED naming the rank; Reset forgets it and
// makes fresh communicators, which reduce again.
TEST(NcclDeviceReductionTest, ARankAloneIsReleasedByItsDeadline) {
  MT_SKIP_WITHOUT_CUDA();
  const int gpus = VisibleGpus();
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs for a peer, found " << gpus;
  const size_t shard = 1024;
  TwoGpus two = MakeTwoGpus(absl::Seconds(3), shard);
  ASSERT_NE(two.reduction, nullptr);
  std::vector<Gpu>& lanes = two.lanes;
  NcclDeviceReduction& reduction = *two.reduction;
  std::vector<DeviceBuffer>& sums = two.sums;
  const auto both = [&]() {
    std::vector<absl::Status> enqueued(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        enqueued[r] = lanes[r].device->MakeCurrent();
        if (enqueued[r].ok()) {
          enqueued[r] =
              reduction.EnqueueReduceScatter(r, *lanes[r].copy_out, sums[r].data_as<float>(),
                                             sums[r].data_as<float>() + r * shard, shard, {});
        }
        if (enqueued[r].ok()) enqueued[r] = lanes[r].copy_out->Synchronize();
      });
    }
    for (std::thread& t : threads) t.join();
    return enqueued;
  };
  // Together first: NCCL connects lazily, at the first collective, which needs both ranks.
  for (const absl::Status& s : both()) ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(reduction.Failure().ok());
  reduction.Reset();
  ASSERT_TRUE(lanes[0].device->MakeCurrent().ok());
  const absl::Time begin = absl::Now();
  const absl::Status alone = reduction.EnqueueReduceScatter(
      0, *lanes[0].copy_out, sums[0].data_as<float>(), sums[0].data_as<float>(), shard, {});
  (void)lanes[0].copy_out->Synchronize();  // drains once aborted (its error, if any, is moot)
  const absl::Duration waited = absl::Now() - begin;
  EXPECT_LT(waited, absl::Seconds(30)) << "enqueue: " << alone;
  const absl::Status failure = reduction.Failure();
  if (alone.ok()) {
    EXPECT_EQ(failure.code(), absl::StatusCode::kDeadlineExceeded) << failure;
    EXPECT_NE(failure.message().find("local rank 0"), std::string::npos) << failure;
  } else {
    // NCCL may instead hold the enqueue itself until the same timeout (Settle says so).
    EXPECT_EQ(alone.code(), absl::StatusCode::kDeadlineExceeded) << alone;
  }
  reduction.Reset();
  EXPECT_TRUE(reduction.Failure().ok());
  for (const absl::Status& s : both()) EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace megatrain::engine::dist
