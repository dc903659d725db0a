// NcclCommunicator on every visible GPU: each collective against a double-precision host
// reference over odd sizes, in a world of one GPU and (with >= 2) of all of them, the world of
// one made over a host Communicator, and a peer that never calls (DEADLINE_EXCEEDED, aborted).
// Skips without a device ("no CUDA device").
#include "engine/dist/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/dist/communicator.h"
#include "engine/dist/nccl_test_values.h"
#include "kernels/common/bf16.h"
#include "kernels/cuda/cuda_test_util.h"

namespace megatrain::engine::dist {
namespace {

using testing::Contribution;
using testing::FirstMiss;
using testing::Reference;
using testing::SumOverRanks;

// Odd sizes: one element, fewer than a warp, one past a page of floats, one past 4 MiB.
constexpr size_t kSizes[] = {1, 7, 4097, (size_t{1} << 20) + 3};

int VisibleGpus() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

// The worlds to test: one GPU, and every GPU when there are at least two.
std::vector<int> WorldSizes() {
  const int gpus = VisibleGpus();
  std::vector<int> sizes = {1};
  if (gpus >= 2) sizes.push_back(gpus);
  return sizes;
}

// Device memory of one GPU; every access first makes that GPU current.
template <class T>
class RankBuffer {
 public:
  RankBuffer(int device, size_t count) : device_(device), count_(count) {
    EXPECT_EQ(cudaSetDevice(device_), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&ptr_, std::max<size_t>(count_, 1) * sizeof(T)), cudaSuccess);
  }
  RankBuffer(const RankBuffer&) = delete;
  RankBuffer& operator=(const RankBuffer&) = delete;
  ~RankBuffer() {
    if (ptr_ != nullptr) {
      cudaSetDevice(device_);
      cudaFree(ptr_);
    }
  }
  T* get() const { return static_cast<T*>(ptr_); }
  void Upload(const std::vector<T>& host) {
    ASSERT_EQ(host.size(), count_);
    ASSERT_EQ(cudaSetDevice(device_), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(ptr_, host.data(), count_ * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::vector<T> Download() const {
    std::vector<T> host(count_);
    EXPECT_EQ(cudaSetDevice(device_), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(host.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }

 private:
  int device_;
  size_t count_;
  void* ptr_ = nullptr;
};

template <class T>
using RankBuffers = std::vector<std::unique_ptr<RankBuffer<T>>>;

// One buffer of `count` elements on each rank of a world of `w`; rank r's holds `contents(r)`
// when `contents` is given.
template <class T>
RankBuffers<T> PerRankBuffers(int w, size_t count,
                              const std::function<std::vector<T>(int)>& contents = nullptr) {
  RankBuffers<T> buffers;
  for (int r = 0; r < w; ++r) {
    buffers.push_back(std::make_unique<RankBuffer<T>>(r, count));
    if (contents) buffers.back()->Upload(contents(r));
  }
  return buffers;
}

class RankStream {
 public:
  explicit RankStream(int device) : device_(device) {
    EXPECT_EQ(cudaSetDevice(device_), cudaSuccess);
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  RankStream(const RankStream&) = delete;
  RankStream& operator=(const RankStream&) = delete;
  ~RankStream() {
    if (stream_ != nullptr) {
      cudaSetDevice(device_);
      cudaStreamDestroy(stream_);
    }
  }
  cudaStream_t get() const { return stream_; }

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
};

// This process's ranks on GPUs 0..world-1, each with its stream; closed at the end.
class World {
 public:
  static std::unique_ptr<World> Make(int world, const NcclOptions& options = {}) {
    std::vector<int> devices(static_cast<size_t>(world));
    std::iota(devices.begin(), devices.end(), 0);
    absl::StatusOr<std::vector<NcclCommunicator>> ranks =
        NcclCommunicator::CreateForDevices(devices, options);
    EXPECT_TRUE(ranks.ok()) << ranks.status();
    if (!ranks.ok()) return nullptr;
    auto made = std::unique_ptr<World>(new World());
    made->ranks_ = std::move(*ranks);
    for (NcclCommunicator& rank : made->ranks_) {
      made->pointers_.push_back(&rank);
      made->streams_.push_back(std::make_unique<RankStream>(rank.device()));
    }
    return made;
  }
  World(const World&) = delete;
  World& operator=(const World&) = delete;
  ~World() { EXPECT_TRUE(NcclClose(absl::MakeSpan(pointers_)).ok()); }

  int size() const { return static_cast<int>(ranks_.size()); }
  NcclCommunicator& rank(int r) { return ranks_[r]; }
  cudaStream_t stream(int r) const { return streams_[r]->get(); }

  // `call(r)` for every rank in one NCCL group, then every rank's stream synchronized.
  template <class Call>
  absl::Status Run(Call call) {
    absl::Status status = NcclGroup(absl::MakeSpan(pointers_), [&]() -> absl::Status {
      for (int r = 0; r < size(); ++r) {
        absl::Status one = call(r);
        if (!one.ok()) return one;
      }
      return absl::OkStatus();
    });
    for (int r = 0; r < size() && status.ok(); ++r) status = ranks_[r].Synchronize(stream(r));
    return status;
  }

 private:
  World() = default;
  std::vector<NcclCommunicator> ranks_;
  std::vector<NcclCommunicator*> pointers_;
  std::vector<std::unique_ptr<RankStream>> streams_;
};

// `body(world, n)` for each world of WorldSizes() and each n of kSizes, under a trace naming
// both; stops at the first fatal failure.
template <class Body>
void ForEachWorldAndSize(Body body) {
  for (const int w : WorldSizes()) {
    std::unique_ptr<World> world = World::Make(w);
    ASSERT_NE(world, nullptr);
    for (const size_t n : kSizes) {
      SCOPED_TRACE(absl::StrCat("world ", w, ", n ", n));
      body(*world, n);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

void ExpectWithin(const std::vector<float>& got, const Reference& ref, size_t offset,
                  const std::string& what) {
  const int64_t miss = FirstMiss(got, ref, offset);
  if (miss >= 0) {
    const size_t i = offset + static_cast<size_t>(miss);
    ADD_FAILURE() << what << "[" << i << "] = " << got[static_cast<size_t>(miss)] << ", want "
                  << ref.sum[i] << " +- " << ref.bound[i];
  }
}

TEST(NcclShardElementsTest, CeilOfTheShare) {
  EXPECT_EQ(NcclShardElements(1, 1), 1u);
  EXPECT_EQ(NcclShardElements(7, 2), 4u);
  EXPECT_EQ(NcclShardElements(8, 2), 4u);
  EXPECT_EQ(NcclShardElements(4097, 8), 513u);
  EXPECT_EQ(NcclShardElements(0, 4), 0u);
}

TEST(NcclCommunicatorTest, EmptyDeviceListIsRefused) {
  absl::StatusOr<std::vector<NcclCommunicator>> made =
      NcclCommunicator::CreateForDevices({}, NcclOptions{});
  EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(made.status().message().find("devices"), std::string::npos) << made.status();
}

TEST(NcclCommunicatorTest, BadDevicesAreNamed) {
  MT_SKIP_WITHOUT_CUDA();
  const int gpus = VisibleGpus();
  absl::StatusOr<std::vector<NcclCommunicator>> beyond =
      NcclCommunicator::CreateForDevices({0, gpus}, NcclOptions{});
  EXPECT_EQ(beyond.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(beyond.status().message().find(absl::StrCat("devices[1] ", gpus)), std::string::npos)
      << beyond.status();
  absl::StatusOr<std::vector<NcclCommunicator>> twice =
      NcclCommunicator::CreateForDevices({0, 0}, NcclOptions{});
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(twice.status().message().find("repeats"), std::string::npos) << twice.status();
}

TEST(NcclCommunicatorTest, ReduceScatterGivesEachRankItsShardOfTheSum) {
  MT_SKIP_WITHOUT_CUDA();
  ForEachWorldAndSize([](World& world, size_t n) {
    const int w = world.size();
    const size_t shard = NcclShardElements(n, w);
    const size_t padded = shard * static_cast<size_t>(w);
    const RankBuffers<float> send = PerRankBuffers<float>(w, padded, [&](int r) {
      std::vector<float> x = Contribution(r, n);
      x.resize(padded, 0.0f);  // the padding's sums are ignored
      return x;
    });
    const RankBuffers<float> recv = PerRankBuffers<float>(w, shard);
    ASSERT_TRUE(world
                    .Run([&](int r) {
                      return world.rank(r).ReduceScatterSum(send[r]->get(), recv[r]->get(), shard,
                                                            world.stream(r));
                    })
                    .ok());
    const Reference ref = SumOverRanks(w, n);
    for (int r = 0; r < w; ++r) {
      ExpectWithin(recv[r]->Download(), ref, static_cast<size_t>(r) * shard,
                   absl::StrCat("rank ", r, " shard"));
    }
  });
}

TEST(NcclCommunicatorTest, AllReduceIsTheSumOnEveryRankAndRepeatsBitForBit) {
  MT_SKIP_WITHOUT_CUDA();
  ForEachWorldAndSize([](World& world, size_t n) {
    const int w = world.size();
    const RankBuffers<float> send =
        PerRankBuffers<float>(w, n, [&](int r) { return Contribution(r, n); });
    const RankBuffers<float> recv = PerRankBuffers<float>(w, n);
    auto all_reduce = [&](int r) {
      return world.rank(r).AllReduceSum(send[r]->get(), recv[r]->get(), n, world.stream(r));
    };
    ASSERT_TRUE(world.Run(all_reduce).ok());
    const Reference ref = SumOverRanks(w, n);
    std::vector<std::vector<float>> first;
    for (int r = 0; r < w; ++r) {
      first.push_back(recv[r]->Download());
      ExpectWithin(first.back(), ref, 0, absl::StrCat("rank ", r));
      // Every rank holds the same bits (the data-parallel replicas stay identical).
      EXPECT_EQ(std::memcmp(first.back().data(), first[0].data(), n * sizeof(float)), 0)
          << "rank " << r << " differs from rank 0";
    }
    // The same call on the same data gives the same bits (fixed world, size and config).
    ASSERT_TRUE(world.Run(all_reduce).ok());
    for (int r = 0; r < w; ++r) {
      EXPECT_EQ(std::memcmp(recv[r]->Download().data(), first[r].data(), n * sizeof(float)), 0)
          << "rank " << r << ": a second all-reduce gave other bits";
    }
  });
}

// Each rank's shard of `shard` elements gathered in rank order on every rank, bitwise, for
// element type T (`element`); `to_t` turns a rank's fp32 contribution into T.
template <class T, class ToT>
void ExpectAllGatherInRankOrder(World& world, size_t shard, NcclElement element, ToT to_t,
                                const std::string& what) {
  const int w = world.size();
  const size_t total = shard * static_cast<size_t>(w);
  const RankBuffers<T> send =
      PerRankBuffers<T>(w, shard, [&](int r) { return to_t(Contribution(r, shard)); });
  const RankBuffers<T> recv = PerRankBuffers<T>(w, total);
  ASSERT_TRUE(world
                  .Run([&](int r) {
                    return world.rank(r).AllGather(send[r]->get(), recv[r]->get(), shard, element,
                                                   world.stream(r));
                  })
                  .ok());
  std::vector<T> want;
  for (int r = 0; r < w; ++r) {
    const std::vector<T> x = to_t(Contribution(r, shard));
    want.insert(want.end(), x.begin(), x.end());
  }
  for (int r = 0; r < w; ++r) {
    EXPECT_EQ(std::memcmp(recv[r]->Download().data(), want.data(), total * sizeof(T)), 0)
        << "rank " << r << ": " << what << " gather differs";
  }
}

TEST(NcclCommunicatorTest, AllGatherConcatenatesShardsInRankOrderBitwise) {
  MT_SKIP_WITHOUT_CUDA();
  ForEachWorldAndSize([](World& world, size_t shard) {
    ExpectAllGatherInRankOrder<float>(
        world, shard, NcclElement::kFloat32, [](std::vector<float> x) { return x; }, "fp32");
    // bf16 shards (the compute copy)
    ExpectAllGatherInRankOrder<uint16_t>(
        world, shard, NcclElement::kBfloat16,
        [](const std::vector<float>& x) { return kernels::cuda::testing::ToBf16(x); }, "bf16");
  });
}

TEST(NcclCommunicatorTest, BroadcastCopiesRootsBytesToEveryRank) {
  MT_SKIP_WITHOUT_CUDA();
  ForEachWorldAndSize([](World& world, size_t n) {
    const int w = world.size();
    const int root = w - 1;
    const size_t bytes = n * sizeof(float) - (n > 1 ? 1 : 0);  // an odd byte count too
    SCOPED_TRACE(absl::StrCat("bytes ", bytes));
    const RankBuffers<uint8_t> buffers = PerRankBuffers<uint8_t>(w, bytes, [&](int r) {
      const std::vector<float> x = Contribution(r, n);
      std::vector<uint8_t> raw(bytes);
      std::memcpy(raw.data(), x.data(), bytes);
      return raw;
    });
    ASSERT_TRUE(world
                    .Run([&](int r) {
                      return world.rank(r).Broadcast(buffers[r]->get(), buffers[r]->get(), bytes,
                                                     root, world.stream(r));
                    })
                    .ok());
    const std::vector<uint8_t> want = buffers[root]->Download();
    for (int r = 0; r < w; ++r) {
      EXPECT_EQ(buffers[r]->Download(), want) << "rank " << r;
    }
    const std::vector<float> root_values = Contribution(root, n);
    EXPECT_EQ(std::memcmp(want.data(), root_values.data(), bytes), 0) << "root's bytes changed";
  });
}

TEST(NcclCommunicatorTest, WorldOfOneOverAHostCommunicator) {
  MT_SKIP_WITHOUT_CUDA();
  SingleProcessCommunicator host;
  absl::StatusOr<NcclCommunicator> made = NcclCommunicator::CreateOverHost(host, 0, NcclOptions{});
  ASSERT_TRUE(made.ok()) << made.status();
  NcclCommunicator& comm = *made;
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);
  RankStream stream(0);
  const size_t n = kSizes[3];
  RankBuffer<float> data(0, n);
  const std::vector<float> x = Contribution(0, n);
  data.Upload(x);
  // In place, outside any group: a world of one sums one term, so the bits stay.
  ASSERT_TRUE(comm.AllReduceSum(data.get(), data.get(), n, stream.get()).ok());
  ASSERT_TRUE(comm.Synchronize(stream.get()).ok());
  EXPECT_EQ(std::memcmp(data.Download().data(), x.data(), n * sizeof(float)), 0);

  const absl::Status bad_root = comm.Broadcast(data.get(), data.get(), 4, 1, stream.get());
  EXPECT_EQ(bad_root.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_root.message().find("root 1"), std::string::npos) << bad_root;
  EXPECT_TRUE(comm.usable()) << "a refused argument must not end the communicator";

  ASSERT_TRUE(comm.Close().ok());
  EXPECT_FALSE(comm.usable());
  const absl::Status closed = comm.AllReduceSum(data.get(), data.get(), n, stream.get());
  EXPECT_EQ(closed.code(), absl::StatusCode::kFailedPrecondition) << closed;
}

// Issue 18's fault point: rank 0 calls an all-reduce its peers never join (as if they had
// died); the call or the wait fails within the collective timeout and rank 0 is aborted.
TEST(NcclCommunicatorTest, APeerThatNeverCallsFailsWithinTheTimeout) {
  MT_SKIP_WITHOUT_CUDA();
  const int gpus = VisibleGpus();
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs for a peer, found " << gpus;
  NcclOptions options;
  options.collective_timeout = absl::Seconds(5);
  std::unique_ptr<World> world = World::Make(2, options);
  ASSERT_NE(world, nullptr);
  const size_t n = 4097;
  RankBuffer<float> data(0, n);
  data.Upload(Contribution(0, n));
  const absl::Time start = absl::Now();
  absl::Status status = world->rank(0).AllReduceSum(data.get(), data.get(), n, world->stream(0));
  if (status.ok()) status = world->rank(0).Synchronize(world->stream(0));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_NE(status.message().find("rank 0"), std::string::npos) << status;
  EXPECT_FALSE(world->rank(0).usable());
  // Bounded: the call's wait and Synchronize's each stop at the timeout; Synchronize then waits
  // at most as long again for the aborted kernels to leave the stream.
  EXPECT_LT(took, 3 * options.collective_timeout + absl::Seconds(10)) << took;
  world->rank(1).Abort();  // its peer is gone; NcclClose skips both
}

}  // namespace
}  // namespace megatrain::engine::dist
