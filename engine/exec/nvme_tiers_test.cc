// Unit tests of the NVMe gradient and compute-copy files: chunk layout,
// overwrite and accumulate, norm partials equal to the whole-buffer norm,
// reference-counted copy staging and its flow control (a copy waits for a
// release when too many chunks are held, and stops waiting when the stream
// that runs the releases has failed), and reads of whole entries.
#include <atomic>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "engine/device/cpu_device.h"
#include "engine/exec/nvme_compute_copy.h"
#include "engine/exec/nvme_gradients.h"
#include "engine/exec/nvme_weight_copy.h"
#include "engine/optimizer/grad_norm.h"
#include "engine/tiers/test_dir.h"
#include "engine/tiers/uring_block_io.h"
#include "gtest/gtest.h"

namespace megatrain::engine {
namespace {

constexpr size_t kChunk = kGradNormChunkElements;  // the smallest chunk

std::vector<float> Ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(i % 1013) - 3.0f;
  return v;
}

TEST(NvmeGradientsTest, OverwriteThenAccumulateAndTheNormOfTheSum) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("nvme_gradients_unit", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  auto io = tiers::UringBlockIo::Create();
  ASSERT_TRUE(io.ok()) << io.status();
  // Entry 0 stays in RAM (no bytes in the file); entry 1 is 2.5 chunks.
  const size_t n = 2 * kChunk + kChunk / 2;
  const EntryChunks chunks({0, n}, kChunk);
  tiers::NvmeStateStoreOptions options;
  options.dir = dir;
  auto grads = NvmeGradients::Create(**io, options, chunks, {false, true});
  ASSERT_TRUE(grads.ok()) << grads.status();
  ASSERT_EQ((*grads)->num_chunks(1), 3);
  const std::vector<float> a = Ramp(n, 0.5f), b = Ramp(n, -0.25f);
  for (const std::vector<float>* part : {&a, &b}) {
    const bool overwrite = part == &a;
    for (int c = 0; c < 3; ++c) {
      const EntryChunk chunk = (*grads)->chunk(1, c);
      absl::StatusOr<float*> staged = (*grads)->BeginChunk(1, c, overwrite);
      ASSERT_TRUE(staged.ok()) << staged.status();
      for (size_t j = 0; j < chunk.count; ++j) {
        const float value = (*part)[chunk.first + j];
        (*staged)[j] = overwrite ? value : (*staged)[j] + value;
      }
      ASSERT_TRUE((*grads)->EndChunk(1, c).ok());
    }
  }
  std::vector<float> sum(n), read(n);
  for (size_t j = 0; j < n; ++j) sum[j] = a[j] + b[j];
  ASSERT_TRUE((*grads)->Read(1, read.data()).ok());
  EXPECT_EQ(std::memcmp(read.data(), sum.data(), n * sizeof(float)), 0);
  const double whole = GradSumOfSquares(sum, nullptr);
  const double chunked = (*grads)->SumOfSquares(1);
  EXPECT_EQ(std::memcmp(&whole, &chunked, sizeof(double)), 0);
  // The optimizer's read-back, in unit order.
  for (int c = 0; c < 3; ++c) {
    absl::StatusOr<const float*> staged = (*grads)->AcquireForUpdate(1, c);
    ASSERT_TRUE(staged.ok()) << staged.status();
    const EntryChunk chunk = (*grads)->chunk(1, c);
    EXPECT_EQ(std::memcmp(*staged, sum.data() + chunk.first, chunk.count * sizeof(float)), 0);
    ASSERT_TRUE((*grads)->ReleaseAfterUpdate(1, c).ok());
  }
}

TEST(NvmeComputeCopyTest, Bf16ChunksRoundTripAndCopiesShareAChunk) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("nvme_compute_copy_unit", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  auto io = tiers::UringBlockIo::Create();
  ASSERT_TRUE(io.ok()) << io.status();
  const size_t n = 3 * kChunk + 7;  // odd: the last bf16 unit ends inside a float
  const EntryChunks chunks({n}, kChunk);
  tiers::NvmeStateStoreOptions options;
  options.dir = dir;
  auto copy = NvmeComputeCopy::Create(**io, options, chunks, sizeof(uint16_t), {true});
  ASSERT_TRUE(copy.ok()) << copy.status();
  std::vector<uint16_t> values(n);
  std::iota(values.begin(), values.end(), uint16_t{1});
  for (int c = 0; c < (*copy)->num_chunks(0); ++c) {
    const EntryChunk chunk = (*copy)->chunk(0, c);
    absl::StatusOr<char*> out = (*copy)->BeginWrite(0, c);
    ASSERT_TRUE(out.ok()) << out.status();
    std::memcpy(*out, values.data() + chunk.first, chunk.count * sizeof(uint16_t));
    ASSERT_TRUE((*copy)->EndWrite(0, c).ok());
  }
  ASSERT_TRUE((*copy)->Flush().ok());
  std::vector<uint16_t> read(n);
  ASSERT_TRUE((*copy)->Read(0, reinterpret_cast<char*>(read.data())).ok());
  EXPECT_EQ(read, values);
  // Two fragments of one chunk share its staging; it is freed after both release.
  absl::StatusOr<const char*> first = (*copy)->AcquireForCopy(0, 1);
  absl::StatusOr<const char*> second = (*copy)->AcquireForCopy(0, 1);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(*first, *second);
  EXPECT_EQ(std::memcmp(*first, values.data() + kChunk, kChunk * sizeof(uint16_t)), 0);
  (*copy)->ReleaseAfterCopy(0, 1);
  (*copy)->ReleaseAfterCopy(0, 1);
}

// One fp32 entry of 6 chunks in a compute-copy file of a fresh scratch directory, with the
// default staging (5 slots: copies may hold 3). `usable` is the directory's O_DIRECT verdict.
struct ScratchCopy {
  absl::Status usable;
  std::unique_ptr<tiers::UringBlockIo> io;
  std::unique_ptr<NvmeComputeCopy> copy;
};

ScratchCopy MakeScratchCopy(const std::string& name) {
  ScratchCopy s;
  const std::string dir = tiers::FreshTestDir(name, &s.usable);
  if (!s.usable.ok()) return s;
  auto io = tiers::UringBlockIo::Create();
  EXPECT_TRUE(io.ok()) << io.status();
  if (!io.ok()) return s;
  s.io = *std::move(io);
  tiers::NvmeStateStoreOptions options;
  options.dir = dir;
  auto copy = NvmeComputeCopy::Create(*s.io, options, EntryChunks({6 * kChunk}, kChunk),
                                      sizeof(float), {true});
  EXPECT_TRUE(copy.ok()) << copy.status();
  if (copy.ok()) s.copy = *std::move(copy);
  return s;
}

TEST(NvmeComputeCopyTest, ACopyBeyondTheHeldLimitWaitsForARelease) {
  ScratchCopy scratch = MakeScratchCopy("nvme_compute_copy_flow");
  if (!scratch.usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << scratch.usable;
  ASSERT_NE(scratch.copy, nullptr);
  auto copy = &scratch.copy;
  for (int c = 0; c < 3; ++c) ASSERT_TRUE((*copy)->AcquireForCopy(0, c).ok());
  std::atomic<bool> acquired{false};
  std::thread fourth([&] {
    EXPECT_TRUE((*copy)->AcquireForCopy(0, 3).ok());
    acquired = true;
  });
  // The fourth waits until a release; the release is what lets it go on
  // (checked by state, not by time: it cannot have returned before).
  EXPECT_FALSE(acquired.load());
  (*copy)->ReleaseAfterCopy(0, 0);
  fourth.join();
  EXPECT_TRUE(acquired.load());
  for (int c : {1, 2, 3}) (*copy)->ReleaseAfterCopy(0, c);
}

// The releases run as copy-in stream tasks; a failed stream skips them. A copy waiting for room
// then ends with the stream's failure instead of waiting forever.
TEST(NvmeComputeCopyTest, AWaitForRoomEndsWhenTheCopiesFail) {
  ScratchCopy scratch = MakeScratchCopy("nvme_compute_copy_failed");
  if (!scratch.usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << scratch.usable;
  ASSERT_NE(scratch.copy, nullptr);
  auto copy = &scratch.copy;
  std::atomic<bool> stream_failed{false};
  auto copies_failed = [&]() -> absl::Status {
    return stream_failed ? absl::InternalError("stream 'copy_in': device fault") : absl::OkStatus();
  };
  for (int c = 0; c < 3; ++c) ASSERT_TRUE((*copy)->AcquireForCopy(0, c, copies_failed).ok());
  absl::StatusOr<const char*> fourth = nullptr;
  std::thread waiter([&] { fourth = (*copy)->AcquireForCopy(0, 3, copies_failed); });
  stream_failed = true;
  waiter.join();
  ASSERT_FALSE(fourth.ok());
  EXPECT_EQ(fourth.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(fourth.status().message().find("the copies that release them failed"),
            std::string::npos)
      << fourth.status();
  EXPECT_NE(fourth.status().message().find("compute_copy.bin"), std::string::npos)
      << fourth.status();
}

// The same through the executor's weight copy on a CPU-device stream that has failed: a copy of
// six chunks, more than the three a copy may hold, returns the failure (the releases behind it
// are skipped) instead of blocking its thread.
TEST(NvmeWeightCopyTest, AFailedCopyInStreamEndsTheCopyInsteadOfHangingIt) {
  ScratchCopy scratch = MakeScratchCopy("nvme_weight_copy_failed");
  if (!scratch.usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << scratch.usable;
  ASSERT_NE(scratch.copy, nullptr);
  auto copy = &scratch.copy;
  DeviceOptions device_options;
  device_options.arena_bytes = 8 * kChunk * sizeof(float);
  auto device = CpuDevice::Create(device_options);
  ASSERT_TRUE(device.ok()) << device.status();
  auto copy_in = (*device)->CreateStream("copy_in");
  ASSERT_TRUE(copy_in.ok()) << copy_in.status();
  auto weights = (*device)->Allocate(6 * kChunk * sizeof(float), "weights");
  ASSERT_TRUE(weights.ok()) << weights.status();
  (*copy_in)->EnqueueFallibleHostTask([] { return absl::InternalError("an earlier copy failed"); });
  ASSERT_FALSE((*copy_in)->Synchronize().ok());
  const absl::Status copied = EnqueueNvmeWeightCopy(**copy_in, **copy, 0, 0, 6 * kChunk,
                                                    weights->data(), {SpanKind::kCopyIn, "w", 0});
  ASSERT_FALSE(copied.ok());
  EXPECT_NE(copied.message().find("an earlier copy failed"), std::string::npos) << copied;
}

}  // namespace
}  // namespace megatrain::engine
