// CommunicatorDeviceReduction in a world of one (the MPI worlds run under mpirun in
// tests/dist/dp_reduce_scatter_test.sh): the shard lands on the stream, in place or apart; a rank
// other than the process's and null buffers are refused; an aborted step's calls do nothing
// until Reset.
#include "engine/dist/communicator_device_reduction.h"

#include <memory>
#include <vector>

#include "engine/device/cpu_device.h"
#include "gtest/gtest.h"

namespace megatrain::engine::dist {
namespace {

class CommunicatorDeviceReductionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DeviceOptions options;
    options.arena_bytes = 1 << 20;
    auto device = CpuDevice::Create(options);
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = std::move(*device);
    auto stream = device_->CreateStream("copy_out");
    ASSERT_TRUE(stream.ok()) << stream.status();
    stream_ = std::move(*stream);
  }

  SingleProcessCommunicator one_;
  std::unique_ptr<CpuDevice> device_;
  std::unique_ptr<Stream> stream_;
};

TEST_F(CommunicatorDeviceReductionTest, AWorldOfOneKeepsItsShardOnTheStream) {
  CommunicatorDeviceReduction reduction(one_);
  EXPECT_EQ(reduction.world(), 1);
  EXPECT_EQ(reduction.order(), "rank order");
  std::vector<float> send = {1.5f, -2.25f, 3.0f};
  std::vector<float> recv(3, 0.0f);
  ASSERT_TRUE(reduction.EnqueueReduceScatter(0, *stream_, send.data(), recv.data(), 3, {}).ok());
  ASSERT_TRUE(reduction.EnqueueReduceScatter(0, *stream_, send.data(), send.data(), 3, {}).ok());
  ASSERT_TRUE(stream_->Synchronize().ok());
  EXPECT_EQ(recv, send);
  EXPECT_EQ(send, (std::vector<float>{1.5f, -2.25f, 3.0f}));
}

TEST_F(CommunicatorDeviceReductionTest, RefusesAnotherRankAndNullBuffers) {
  CommunicatorDeviceReduction reduction(one_);
  float x = 0;
  const absl::Status other = reduction.EnqueueReduceScatter(1, *stream_, &x, &x, 1, {});
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(other.message().find("rank=1 but this process is rank 0 of 1"), std::string::npos)
      << other;
  EXPECT_EQ(reduction.EnqueueReduceScatter(0, *stream_, nullptr, &x, 1, {}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(reduction.EnqueueReduceScatter(0, *stream_, nullptr, nullptr, 0, {}).ok());
  EXPECT_TRUE(stream_->Synchronize().ok());
}

TEST_F(CommunicatorDeviceReductionTest, AnAbortedStepsCallsDoNothingUntilReset) {
  CommunicatorDeviceReduction reduction(one_);
  std::vector<float> send = {4.0f};
  std::vector<float> recv = {0.0f};
  reduction.Abort();
  ASSERT_TRUE(reduction.EnqueueReduceScatter(0, *stream_, send.data(), recv.data(), 1, {}).ok());
  ASSERT_TRUE(stream_->Synchronize().ok());  // the stream stays healthy
  EXPECT_EQ(recv[0], 0.0f);
  reduction.Reset();
  ASSERT_TRUE(reduction.EnqueueReduceScatter(0, *stream_, send.data(), recv.data(), 1, {}).ok());
  ASSERT_TRUE(stream_->Synchronize().ok());
  EXPECT_EQ(recv[0], 4.0f);
}

}  // namespace
}  // namespace megatrain::engine::dist
