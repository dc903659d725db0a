// Tests of UringBlockIo and FaultInjectingBlockIo against real O_DIRECT files.
#include "engine/tiers/uring_block_io.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/tiers/aligned_buffer.h"
#include "engine/tiers/fault_injecting_block_io.h"
#include "engine/tiers/test_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::engine::tiers {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr absl::Duration kBound = absl::Seconds(60);

class UringBlockIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::Status usable;
    dir_ = FreshTestDir(::testing::UnitTest::GetInstance()->current_test_info()->name(), &usable);
    if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
    absl::StatusOr<std::unique_ptr<UringBlockIo>> io = UringBlockIo::Create({.queue_depth = 4});
    if (!io.ok()) GTEST_SKIP() << "io_uring unavailable on this kernel: " << io.status();
    io_ = *std::move(io);
    absl::StatusOr<DirectFile> file =
        DirectFile::Open(dir_ + "/data.bin", DirectFile::Mode::kCreateTruncate);
    ASSERT_TRUE(file.ok()) << file.status();
    file_ = *std::move(file);
  }

  static void Fill(AlignedBuffer& b, size_t bytes, unsigned seed) {
    auto* p = b.data_as<unsigned char>();
    for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>((i * 131 + seed) >> 3);
  }

  std::string dir_;
  std::unique_ptr<UringBlockIo> io_;
  DirectFile file_;
};

TEST_F(UringBlockIoTest, OddSizedPayloadsRoundTripPaddedToBlocks) {
  const std::vector<size_t> sizes = {1, 4095, 4097, 12345, (size_t{1} << 20) + 3};
  std::vector<AlignedBuffer> out, in;
  std::vector<uint64_t> offsets;
  uint64_t offset = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    out.push_back(*AlignedBuffer::Allocate(sizes[i]));
    in.push_back(*AlignedBuffer::Allocate(sizes[i]));
    ASSERT_EQ(out.back().size(), RoundUpToBlock(sizes[i]));
    Fill(out.back(), sizes[i], static_cast<unsigned>(i + 7));
    offsets.push_back(offset);
    offset += out.back().size();
  }
  std::vector<IoFuture> writes;
  for (size_t i = 0; i < sizes.size(); ++i) {
    writes.push_back(io_->Submit({IoOp::kWrite, &file_, offsets[i], out[i].data(), out[i].size()}));
  }
  for (const IoFuture& f : writes) ASSERT_TRUE(f.Wait(kBound).ok()) << f.Wait(kBound);
  std::vector<IoFuture> reads;
  for (size_t i = 0; i < sizes.size(); ++i) {
    reads.push_back(io_->Submit({IoOp::kRead, &file_, offsets[i], in[i].data(), in[i].size()}));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_TRUE(reads[i].Wait(kBound).ok()) << reads[i].Wait(kBound);
    EXPECT_EQ(std::memcmp(out[i].data(), in[i].data(), sizes[i]), 0) << "payload " << sizes[i];
  }
}

TEST_F(UringBlockIoTest, ManyMoreRequestsThanQueueDepthAllComplete) {
  constexpr int kRequests = 203;
  constexpr size_t kBytes = 2 * kDirectIoAlignment;
  AlignedBuffer out = *AlignedBuffer::Allocate(kRequests * kBytes);
  AlignedBuffer in = *AlignedBuffer::Allocate(kRequests * kBytes);
  Fill(out, out.size(), 3);
  std::vector<IoFuture> futures;
  for (int i = 0; i < kRequests; ++i) {
    futures.push_back(
        io_->Submit({IoOp::kWrite, &file_, i * kBytes, out.data_as<char>() + i * kBytes, kBytes}));
  }
  for (const IoFuture& f : futures) ASSERT_TRUE(f.Wait(kBound).ok());
  futures.clear();
  // Read back in reverse order so completions arrive out of submission order.
  for (int i = kRequests - 1; i >= 0; --i) {
    futures.push_back(
        io_->Submit({IoOp::kRead, &file_, i * kBytes, in.data_as<char>() + i * kBytes, kBytes}));
  }
  for (const IoFuture& f : futures) ASSERT_TRUE(f.Wait(kBound).ok());
  EXPECT_EQ(std::memcmp(out.data(), in.data(), out.size()), 0);
}

TEST_F(UringBlockIoTest, ReadPastEndOfFileReportsTruncationWithFileAndOffset) {
  AlignedBuffer b = *AlignedBuffer::Allocate(4 * kDirectIoAlignment);
  ASSERT_TRUE(
      io_->Submit({IoOp::kWrite, &file_, 0, b.data(), 2 * kDirectIoAlignment}).Wait(kBound).ok());
  // The kernel returns the 8 KiB that exist (a short read), the remainder then reads 0 bytes.
  const absl::Status s = io_->Submit({IoOp::kRead, &file_, 0, b.data(), b.size()}).Wait(kBound);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr(file_.path()), HasSubstr("truncated"),
                                 HasSubstr("offset 0"), HasSubstr("returned 8192 of 16384")));
}

TEST_F(UringBlockIoTest, MisalignedRequestsAreRejectedNamingTheField) {
  AlignedBuffer b = *AlignedBuffer::Allocate(2 * kDirectIoAlignment);
  EXPECT_THAT(
      io_->Submit({IoOp::kRead, &file_, 100, b.data(), kDirectIoAlignment}).Wait(kBound).message(),
      HasSubstr("offset=100"));
  EXPECT_THAT(io_->Submit({IoOp::kRead, &file_, 0, b.data(), 1000}).Wait(kBound).message(),
              HasSubstr("bytes=1000"));
  EXPECT_EQ(io_->Submit({IoOp::kRead, &file_, 0, b.data_as<char>() + 8, kDirectIoAlignment})
                .Wait(kBound)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(UringBlockIoTest, InjectedFaultsSurfaceWithFileAndOffset) {
  FaultInjectingBlockIo faulty(*io_);
  AlignedBuffer b = *AlignedBuffer::Allocate(kDirectIoAlignment);
  const auto write_at = [&](uint64_t offset) {
    return faulty.Submit({IoOp::kWrite, &file_, offset, b.data(), b.size()}).Wait(kBound);
  };
  faulty.FailNth(3, InjectedFault::kEio);
  EXPECT_TRUE(write_at(0).ok());
  EXPECT_TRUE(write_at(4096).ok());
  absl::Status eio = write_at(8192);
  EXPECT_EQ(eio.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(eio.message(), AllOf(HasSubstr(file_.path()), HasSubstr("offset 8192")));
  EXPECT_TRUE(write_at(8192).ok()) << "only the Nth request fails";

  faulty.FailNth(1, InjectedFault::kEnospc);
  absl::Status full = write_at(12288);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(),
              AllOf(HasSubstr(file_.path()), HasSubstr("offset 12288"), HasSubstr("disk full")));

  faulty.FailNthOf(IoOp::kRead, 2, InjectedFault::kTruncate);
  EXPECT_TRUE(write_at(16384).ok()) << "writes are not counted";
  EXPECT_TRUE(faulty.Submit({IoOp::kRead, &file_, 0, b.data(), b.size()}).Wait(kBound).ok());
  absl::Status truncated =
      faulty.Submit({IoOp::kRead, &file_, 4096, b.data(), b.size()}).Wait(kBound);
  EXPECT_EQ(truncated.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(truncated.message(),
              AllOf(HasSubstr(file_.path()), HasSubstr("truncated"), HasSubstr("offset 4096")));
  EXPECT_EQ(faulty.requests_seen(), 8u);
}

TEST(UringBlockIoOptions, QueueDepthOutOfRangeIsRejected) {
  EXPECT_THAT(UringBlockIo::Create({.queue_depth = 0}).status().message(),
              HasSubstr("queue_depth=0"));
}

}  // namespace
}  // namespace megatrain::engine::tiers
