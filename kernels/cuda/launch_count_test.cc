// Counts the kernel launches of each checked entry point (ops.h) without a GPU
// and checks what each launch receives: grid, block, stream, and every kernel
// argument in order (review point 9, "wrapper argument order"). The test binary
// defines the CUDA runtime's launch hooks that nvcc's <<<>>> stubs call
// (__cudaPushCallConfiguration / __cudaPopCallConfiguration / __cudaGetKernel /
// __cudaLaunchKernel, declared in crt/host_runtime.h and device_functions.h)
// and cudaGetLastError, so the static link binds the stubs of the .cu objects to
// this recorder instead of libcudart; nothing reaches a device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cuda/attention_bodies.h"
#include "kernels/cuda/launch_geometry.h"
#include "kernels/cuda/ops.h"

namespace {

struct RecordedLaunch {
  const void* kernel = nullptr;
  dim3 grid, block;
  size_t shared_bytes = 0;
  cudaStream_t stream = nullptr;
  std::vector<std::vector<unsigned char>> args;  // each argument's bytes, in order
};

// The parameter sizes (bytes) of the next launches, set by the test before a
// call, since a launch's argument array carries no count.
struct Recorder {
  std::vector<std::vector<size_t>> arg_sizes;
  std::vector<RecordedLaunch> launches;
  dim3 pushed_grid, pushed_block;
  size_t pushed_shared = 0;
  cudaStream_t pushed_stream = nullptr;
};

// The hooks below have no other way to reach the test's state: they are
// called by generated code with a fixed signature.
Recorder* recorder = nullptr;

}  // namespace

extern "C" {

unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared_bytes,
                                     struct CUstream_st* stream) {
  recorder->pushed_grid = grid;
  recorder->pushed_block = block;
  recorder->pushed_shared = shared_bytes;
  recorder->pushed_stream = stream;
  return 0;  // 0: go on to the launch
}

cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* shared_bytes,
                                       void* stream) {
  *grid = recorder->pushed_grid;
  *block = recorder->pushed_block;
  *shared_bytes = recorder->pushed_shared;
  *static_cast<cudaStream_t*>(stream) = recorder->pushed_stream;
  return cudaSuccess;
}

cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* function) {
  *kernel = reinterpret_cast<cudaKernel_t>(const_cast<void*>(function));
  return cudaSuccess;
}

cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void** args,
                               size_t shared_bytes, cudaStream_t stream) {
  RecordedLaunch launch;
  launch.kernel = reinterpret_cast<const void*>(kernel);
  launch.grid = grid;
  launch.block = block;
  launch.shared_bytes = shared_bytes;
  launch.stream = stream;
  const size_t index = recorder->launches.size();
  if (index < recorder->arg_sizes.size()) {
    const std::vector<size_t>& sizes = recorder->arg_sizes[index];
    for (size_t i = 0; i < sizes.size(); ++i) {
      const auto* bytes = static_cast<const unsigned char*>(args[i]);
      launch.args.emplace_back(bytes, bytes + sizes[i]);
    }
  }
  recorder->launches.push_back(std::move(launch));
  return cudaSuccess;
}

cudaError_t cudaGetLastError() { return cudaSuccess; }

}  // extern "C"

namespace megatrain::kernels::cuda {
namespace {

// Distinct fake device pointers and a non-default stream; never dereferenced.
template <class T = void>
T* Fake(uintptr_t n) {
  return reinterpret_cast<T*>(0x10000 * n);
}
const cudaStream_t kStream = reinterpret_cast<cudaStream_t>(0x7777);

template <class T>
T Arg(const RecordedLaunch& launch, size_t i) {
  EXPECT_LT(i, launch.args.size());
  T value{};
  if (i >= launch.args.size()) return value;
  EXPECT_EQ(launch.args[i].size(), sizeof(T)) << "argument " << i;
  std::memcpy(&value, launch.args[i].data(), sizeof(T));
  return value;
}

void ExpectShape(const RecordedLaunch& launch, int64_t blocks_x, int64_t blocks_y, int threads) {
  EXPECT_EQ(launch.grid.x, blocks_x);
  EXPECT_EQ(launch.grid.y, blocks_y);
  EXPECT_EQ(launch.grid.z, 1u);
  EXPECT_EQ(launch.block.x, static_cast<unsigned>(threads));
  EXPECT_EQ(launch.block.y, 1u);
  EXPECT_EQ(launch.stream, kStream);
  EXPECT_EQ(launch.shared_bytes, 0u);  // all shared memory is static
}

class LaunchCountTest : public ::testing::Test {
 protected:
  void SetUp() override { recorder = &recorder_; }
  void TearDown() override { recorder = nullptr; }
  Recorder recorder_;
};

TEST_F(LaunchCountTest, RmsnormForwardIsOneRowLaunchWithArgumentsInOrder) {
  recorder_.arg_sizes = {{8, 8, 4, 4, 8, 8}};
  ASSERT_TRUE(
      RmsnormForward(Fake(1), Fake(2), 37, 4097, 1e-5f, Fake(3), Fake<float>(4), kStream).ok());
  ASSERT_EQ(recorder_.launches.size(), 1u);
  const RecordedLaunch& l = recorder_.launches[0];
  ExpectShape(l, 37, 1, kRowThreads);
  EXPECT_EQ(Arg<void*>(l, 0), Fake(1));  // x
  EXPECT_EQ(Arg<void*>(l, 1), Fake(2));  // w
  EXPECT_EQ(Arg<int>(l, 2), 4097);       // dim
  EXPECT_EQ(Arg<float>(l, 3), 1e-5f);    // eps
  EXPECT_EQ(Arg<void*>(l, 4), Fake(3));  // y
  EXPECT_EQ(Arg<void*>(l, 5), Fake(4));  // rstd
}

TEST_F(LaunchCountTest, RmsnormBackwardIsThreeLaunches) {
  constexpr int64_t kRows = 130;
  constexpr int kDim = 4097;
  recorder_.arg_sizes = {{8, 8, 8, 8, 4, 1, 8}, {8, 8, 8, 8, 4, 8}, {8, 8, 4, 8}};
  ASSERT_TRUE(RmsnormBackward(Fake(1), Fake(2), Fake<float>(3), Fake(4), kRows, kDim,
                              /*accumulate_dx=*/true, Fake(5), Fake<float>(6), Fake<float>(7),
                              RmsnormBackwardWorkspaceFloats(kRows, kDim), kStream)
                  .ok());
  ASSERT_EQ(recorder_.launches.size(), 3u);
  const RecordedLaunch& dx = recorder_.launches[0];
  ExpectShape(dx, kRows, 1, kRowThreads);
  EXPECT_EQ(Arg<void*>(dx, 0), Fake(1));  // x
  EXPECT_EQ(Arg<void*>(dx, 1), Fake(2));  // w
  EXPECT_EQ(Arg<void*>(dx, 2), Fake(3));  // rstd
  EXPECT_EQ(Arg<void*>(dx, 3), Fake(4));  // dy
  EXPECT_EQ(Arg<int>(dx, 4), kDim);
  EXPECT_EQ(Arg<bool>(dx, 5), true);      // accumulate
  EXPECT_EQ(Arg<void*>(dx, 6), Fake(5));  // dx
  const RecordedLaunch& partial = recorder_.launches[1];
  const LaunchShape p = DwPartialGrid(kRows, kDim);
  ExpectShape(partial, p.blocks_x, p.blocks_y, kDwThreads);
  EXPECT_EQ(Arg<void*>(partial, 0), Fake(1));  // x
  EXPECT_EQ(Arg<void*>(partial, 1), Fake(4));  // dy
  EXPECT_EQ(Arg<void*>(partial, 2), Fake(3));  // rstd
  EXPECT_EQ(Arg<int64_t>(partial, 3), kRows);
  EXPECT_EQ(Arg<int>(partial, 4), kDim);
  EXPECT_EQ(Arg<void*>(partial, 5), Fake(7));  // partials = the workspace
  const RecordedLaunch& final_sum = recorder_.launches[2];
  ExpectShape(final_sum, DwFinalGrid(kDim).blocks_x, 1, kDwThreads);
  EXPECT_EQ(Arg<void*>(final_sum, 0), Fake(7));  // partials
  EXPECT_EQ(Arg<int64_t>(final_sum, 1), DwRowGroups(kRows));
  EXPECT_EQ(Arg<int>(final_sum, 2), kDim);
  EXPECT_EQ(Arg<void*>(final_sum, 3), Fake(6));  // dw
}

TEST_F(LaunchCountTest, CrossEntropyIsRowsThenOneOrderedSum) {
  recorder_.arg_sizes = {{8, 8, 8, 4, 8, 8}, {8, 8, 8}};
  ASSERT_TRUE(CrossEntropy(Fake(1), Fake<int32_t>(2), 5, 32001, 0.25f, Fake(3), Fake<float>(4),
                           Fake<float>(5), kStream)
                  .ok());
  ASSERT_EQ(recorder_.launches.size(), 2u);
  const RecordedLaunch& rows = recorder_.launches[0];
  ExpectShape(rows, 5, 1, kRowThreads);
  EXPECT_EQ(Arg<void*>(rows, 0), Fake(1));  // logits
  EXPECT_EQ(Arg<void*>(rows, 1), Fake(2));  // targets
  EXPECT_EQ(Arg<int64_t>(rows, 2), 32001);  // vocab
  EXPECT_EQ(Arg<float>(rows, 3), 0.25f);    // scale
  EXPECT_EQ(Arg<void*>(rows, 4), Fake(3));  // dlogits
  EXPECT_EQ(Arg<void*>(rows, 5), Fake(4));  // row_loss
  const RecordedLaunch& sum = recorder_.launches[1];
  ExpectShape(sum, 1, 1, kSumThreads);
  EXPECT_EQ(Arg<void*>(sum, 0), Fake(4));  // row_loss
  EXPECT_EQ(Arg<int64_t>(sum, 1), 5);
  EXPECT_EQ(Arg<void*>(sum, 2), Fake(5));  // loss_sum
}

TEST_F(LaunchCountTest, ElementwiseOpsAreOneLaunchEach) {
  constexpr int64_t kN = 1000003;
  const int64_t blocks = ElementwiseGrid(kN).blocks_x;
  recorder_.arg_sizes = {{8, 8, 8, 8}, {8, 8, 8, 8, 8, 8}, {8, 8, 8, 8}};
  ASSERT_TRUE(SwigluForward(Fake(1), Fake(2), Fake(3), kN, kStream).ok());
  ASSERT_TRUE(SwigluBackward(Fake(1), Fake(2), Fake(4), Fake(5), Fake(6), kN, kStream).ok());
  ASSERT_TRUE(ResidualAdd(Fake(7), Fake(8), Fake(9), kN, kStream).ok());
  ASSERT_EQ(recorder_.launches.size(), 3u);
  for (const RecordedLaunch& l : recorder_.launches) ExpectShape(l, blocks, 1, kElementwiseThreads);
  const RecordedLaunch& fwd = recorder_.launches[0];
  EXPECT_EQ(Arg<void*>(fwd, 0), Fake(1));
  EXPECT_EQ(Arg<void*>(fwd, 1), Fake(2));
  EXPECT_EQ(Arg<void*>(fwd, 2), Fake(3));
  EXPECT_EQ(Arg<int64_t>(fwd, 3), kN);
  const RecordedLaunch& bwd = recorder_.launches[1];
  EXPECT_EQ(Arg<void*>(bwd, 0), Fake(1));  // gate
  EXPECT_EQ(Arg<void*>(bwd, 1), Fake(2));  // up
  EXPECT_EQ(Arg<void*>(bwd, 2), Fake(4));  // dy
  EXPECT_EQ(Arg<void*>(bwd, 3), Fake(5));  // d_gate
  EXPECT_EQ(Arg<void*>(bwd, 4), Fake(6));  // d_up
  EXPECT_EQ(Arg<int64_t>(bwd, 5), kN);
  const RecordedLaunch& add = recorder_.launches[2];
  EXPECT_EQ(Arg<void*>(add, 0), Fake(7));
  EXPECT_EQ(Arg<void*>(add, 1), Fake(8));
  EXPECT_EQ(Arg<void*>(add, 2), Fake(9));
  EXPECT_EQ(Arg<int64_t>(add, 3), kN);
}

TEST_F(LaunchCountTest, RopeIsOneLaunchOverPairs) {
  // Positions from the token index (none given), then per token (packed samples).
  recorder_.arg_sizes = {{8, 8, 4, 4, 4, 8, 8, 8, 1}, {8, 8, 4, 4, 4, 8, 8, 8, 1}};
  ASSERT_TRUE(RopeInPlace(Fake(1), 1024, 8, 128, 1024, Fake<float>(2), Fake<float>(3),
                          /*backward=*/true, kStream)
                  .ok());
  ASSERT_TRUE(RopeInPlace(Fake(1), 1024, 8, 128, 1024, Fake<float>(2), Fake<float>(3),
                          /*backward=*/false, kStream, Fake<int32_t>(4))
                  .ok());
  ASSERT_EQ(recorder_.launches.size(), 2u);
  const int64_t pairs = 1024 * 8 * 64;
  for (int k = 0; k < 2; ++k) {
    const RecordedLaunch& l = recorder_.launches[k];
    ExpectShape(l, ElementwiseGrid(pairs).blocks_x, 1, kElementwiseThreads);
    EXPECT_EQ(Arg<void*>(l, 0), Fake(1));
    EXPECT_EQ(Arg<int64_t>(l, 1), pairs);
    EXPECT_EQ(Arg<int>(l, 2), 8);     // heads
    EXPECT_EQ(Arg<int>(l, 3), 128);   // head_dim
    EXPECT_EQ(Arg<int>(l, 4), 1024);  // seq
    EXPECT_EQ(Arg<void*>(l, 5), Fake(2));
    EXPECT_EQ(Arg<void*>(l, 6), Fake(3));
  }
  EXPECT_EQ(Arg<void*>(recorder_.launches[0], 7), nullptr);
  EXPECT_EQ(Arg<bool>(recorder_.launches[0], 8), true);
  EXPECT_EQ(Arg<void*>(recorder_.launches[1], 7), Fake<int32_t>(4));
  EXPECT_EQ(Arg<bool>(recorder_.launches[1], 8), false);
}

TEST_F(LaunchCountTest, EmbeddingAndRoundingAreOneLaunchEach) {
  recorder_.arg_sizes = {{8, 8, 8, 8, 4, 8}, {8, 8, 8, 8, 4, 8}, {8, 8, 8}};
  ASSERT_TRUE(EmbeddingForward(Fake<int32_t>(1), 33, Fake(2), 32000, 4097, Fake(3), kStream).ok());
  ASSERT_TRUE(EmbeddingBackward(Fake<int32_t>(4), Fake<int32_t>(5), Fake<int32_t>(6), 7, 33,
                                Fake(7), 4097, Fake<float>(8), kStream)
                  .ok());
  ASSERT_TRUE(RoundToBf16(Fake<float>(9), Fake(10), 12345, kStream).ok());
  ASSERT_EQ(recorder_.launches.size(), 3u);
  const RecordedLaunch& gather = recorder_.launches[0];
  ExpectShape(gather, ElementwiseGrid(33 * 4097).blocks_x, 1, kElementwiseThreads);
  EXPECT_EQ(Arg<void*>(gather, 0), Fake(1));  // ids
  EXPECT_EQ(Arg<int64_t>(gather, 1), 33 * 4097);
  EXPECT_EQ(Arg<void*>(gather, 2), Fake(2));  // table
  EXPECT_EQ(Arg<int64_t>(gather, 3), 32000);  // vocab
  EXPECT_EQ(Arg<int>(gather, 4), 4097);       // dim
  EXPECT_EQ(Arg<void*>(gather, 5), Fake(3));  // out
  const RecordedLaunch& scatter = recorder_.launches[1];
  const LaunchShape g = EmbeddingBackwardGrid(7, 4097);
  ExpectShape(scatter, g.blocks_x, g.blocks_y, kEmbeddingBackwardThreads);
  EXPECT_EQ(Arg<void*>(scatter, 0), Fake(4));  // unique_rows
  EXPECT_EQ(Arg<void*>(scatter, 1), Fake(5));  // segment_offsets
  EXPECT_EQ(Arg<void*>(scatter, 2), Fake(6));  // token_order
  EXPECT_EQ(Arg<void*>(scatter, 3), Fake(7));  // dout
  EXPECT_EQ(Arg<int>(scatter, 4), 4097);
  EXPECT_EQ(Arg<void*>(scatter, 5), Fake(8));  // dtable
  const RecordedLaunch& round = recorder_.launches[2];
  ExpectShape(round, ElementwiseGrid(12345).blocks_x, 1, kElementwiseThreads);
  EXPECT_EQ(Arg<void*>(round, 0), Fake(9));
  EXPECT_EQ(Arg<void*>(round, 1), Fake(10));
  EXPECT_EQ(Arg<int64_t>(round, 2), 12345);
}

// The LM head's vocabulary-block path: reset, stats per block, loss (row loss
// then the ordered sum), gradient per block.
TEST_F(LaunchCountTest, HeadBlockPathLaunchesInOrder) {
  constexpr int64_t kRows = 300;
  recorder_.arg_sizes = {
      {8, 8, 8, 8}, {8, 8, 8, 8, 8, 8, 8}, {8, 8, 8, 8, 8, 8}, {8, 8, 8}, {8, 8, 8, 8, 8, 8, 4, 8}};
  ASSERT_TRUE(HeadStatsReset(kRows, Fake<float>(1), Fake<float>(2), Fake<float>(3), kStream).ok());
  ASSERT_TRUE(HeadBlockStats(Fake(4), Fake<int32_t>(5), kRows, 8192, 16384, Fake<float>(1),
                             Fake<float>(2), Fake<float>(3), kStream)
                  .ok());
  ASSERT_TRUE(HeadLossFromStats(Fake<float>(1), Fake<float>(2), Fake<float>(3), Fake<int32_t>(5),
                                kRows, Fake<float>(6), Fake<float>(7), kStream)
                  .ok());
  ASSERT_TRUE(HeadBlockGrad(Fake(4), Fake<int32_t>(5), kRows, 8192, 16384, Fake<float>(1),
                            Fake<float>(2), 0.5f, Fake(8), kStream)
                  .ok());
  ASSERT_EQ(recorder_.launches.size(), 5u);
  const RecordedLaunch& reset = recorder_.launches[0];
  ExpectShape(reset, 2, 1, 256);  // ceil(300 / 256) blocks of 256 rows
  EXPECT_EQ(Arg<int64_t>(reset, 0), kRows);
  EXPECT_EQ(Arg<void*>(reset, 1), Fake(1));
  EXPECT_EQ(Arg<void*>(reset, 2), Fake(2));
  EXPECT_EQ(Arg<void*>(reset, 3), Fake(3));
  const RecordedLaunch& stats = recorder_.launches[1];
  ExpectShape(stats, kRows, 1, kRowThreads);
  EXPECT_EQ(Arg<void*>(stats, 0), Fake(4));  // logits
  EXPECT_EQ(Arg<void*>(stats, 1), Fake(5));  // targets
  EXPECT_EQ(Arg<int64_t>(stats, 2), 8192);   // block_vocab
  EXPECT_EQ(Arg<int64_t>(stats, 3), 16384);  // first_row
  EXPECT_EQ(Arg<void*>(stats, 4), Fake(1));  // row_max
  EXPECT_EQ(Arg<void*>(stats, 5), Fake(2));  // row_sum
  EXPECT_EQ(Arg<void*>(stats, 6), Fake(3));  // target_logit
  const RecordedLaunch& loss = recorder_.launches[2];
  ExpectShape(loss, 2, 1, 256);
  EXPECT_EQ(Arg<void*>(loss, 0), Fake(1));
  EXPECT_EQ(Arg<void*>(loss, 1), Fake(2));
  EXPECT_EQ(Arg<void*>(loss, 2), Fake(3));
  EXPECT_EQ(Arg<void*>(loss, 3), Fake(5));  // targets
  EXPECT_EQ(Arg<int64_t>(loss, 4), kRows);
  EXPECT_EQ(Arg<void*>(loss, 5), Fake(6));  // row_loss
  const RecordedLaunch& sum = recorder_.launches[3];
  ExpectShape(sum, 1, 1, kSumThreads);
  EXPECT_EQ(Arg<void*>(sum, 0), Fake(6));
  EXPECT_EQ(Arg<int64_t>(sum, 1), kRows);
  EXPECT_EQ(Arg<void*>(sum, 2), Fake(7));  // loss_sum
  const RecordedLaunch& grad = recorder_.launches[4];
  ExpectShape(grad, kRows, 1, kRowThreads);
  EXPECT_EQ(Arg<void*>(grad, 0), Fake(4));
  EXPECT_EQ(Arg<void*>(grad, 1), Fake(5));
  EXPECT_EQ(Arg<int64_t>(grad, 2), 8192);
  EXPECT_EQ(Arg<int64_t>(grad, 3), 16384);
  EXPECT_EQ(Arg<void*>(grad, 4), Fake(1));
  EXPECT_EQ(Arg<void*>(grad, 5), Fake(2));
  EXPECT_EQ(Arg<float>(grad, 6), 0.5f);
  EXPECT_EQ(Arg<void*>(grad, 7), Fake(8));  // dlogits
}

void ExpectAttentionDims(const RecordedLaunch& launch, const AttentionShape& shape) {
  const AttentionKernelDims dims = Arg<AttentionKernelDims>(launch, 0);
  EXPECT_EQ(dims.batch, shape.batch);
  EXPECT_EQ(dims.seq, shape.seq);
  EXPECT_EQ(dims.q_heads, shape.q_heads);
  EXPECT_EQ(dims.kv_heads, shape.kv_heads);
  EXPECT_EQ(dims.scale, shape.softmax_scale);
  EXPECT_EQ(dims.segments, shape.segments);
}

// The grids are AttentionLaunchOf's, the shapes attention_bodies_test replays on the CPU.
TEST_F(LaunchCountTest, AttentionIsOneLaunchForwardAndThreeBackward) {
  AttentionShape shape;
  shape.batch = 2;
  shape.seq = 1000;
  shape.q_heads = 32;
  shape.kv_heads = 8;
  shape.head_dim = 128;
  shape.softmax_scale = 0.088f;
  shape.segments = Fake<const int32_t>(11);
  const AttentionKernelDims dims{2, 1000, 32, 8, 0.088f, Fake<const int32_t>(11)};
  constexpr size_t kDims = sizeof(AttentionKernelDims);
  recorder_.arg_sizes = {{kDims, 8, 8, 8, 8, 8}};
  ASSERT_TRUE(
      AttentionForward(shape, Fake(1), Fake(2), Fake(3), Fake(4), Fake<float>(5), kStream).ok());
  ASSERT_EQ(recorder_.launches.size(), 1u);
  const RecordedLaunch& forward = recorder_.launches[0];
  const LaunchShape q_tiles = AttentionLaunchOf<128>(AttentionPass::kForward, dims).shape;
  ExpectShape(forward, q_tiles.blocks_x, q_tiles.blocks_y, kAttnThreads);
  EXPECT_EQ(q_tiles.blocks_x, 63);  // ceil(1000 / 16) query blocks
  EXPECT_EQ(q_tiles.blocks_y, 64);  // batch * q_heads
  ExpectAttentionDims(forward, shape);
  EXPECT_EQ(Arg<void*>(forward, 1), Fake(1));  // q
  EXPECT_EQ(Arg<void*>(forward, 2), Fake(2));  // k
  EXPECT_EQ(Arg<void*>(forward, 3), Fake(3));  // v
  EXPECT_EQ(Arg<void*>(forward, 4), Fake(4));  // out
  EXPECT_EQ(Arg<void*>(forward, 5), Fake(5));  // lse

  recorder_.launches.clear();
  recorder_.arg_sizes = {
      {kDims, 8, 8, 8}, {kDims, 8, 8, 8, 8, 8, 8, 8, 8}, {kDims, 8, 8, 8, 8, 8, 8, 8}};
  ASSERT_TRUE(AttentionBackward(shape, Fake(1), Fake(2), Fake(3), Fake(4), Fake(6), Fake<float>(5),
                                Fake(7), Fake(8), Fake(9), Fake(10),
                                AttentionBackwardWorkspaceBytes(shape), kStream)
                  .ok());
  ASSERT_EQ(recorder_.launches.size(), 3u);  // delta, dK/dV, dQ
  const RecordedLaunch& delta = recorder_.launches[0];
  const LaunchShape delta_tiles = AttentionLaunchOf<128>(AttentionPass::kDelta, dims).shape;
  ExpectShape(delta, delta_tiles.blocks_x, delta_tiles.blocks_y, kAttnThreads);
  ExpectAttentionDims(delta, shape);
  EXPECT_EQ(Arg<void*>(delta, 1), Fake(4));   // out
  EXPECT_EQ(Arg<void*>(delta, 2), Fake(6));   // dout
  EXPECT_EQ(Arg<void*>(delta, 3), Fake(10));  // delta = the workspace
  const RecordedLaunch& dkdv = recorder_.launches[1];
  const LaunchShape kv_tiles = AttentionLaunchOf<128>(AttentionPass::kDkDv, dims).shape;
  ExpectShape(dkdv, kv_tiles.blocks_x, kv_tiles.blocks_y, kAttnThreads);
  EXPECT_EQ(kv_tiles.blocks_y, 16);  // batch * kv_heads
  ExpectAttentionDims(dkdv, shape);
  EXPECT_EQ(Arg<void*>(dkdv, 1), Fake(1));   // q
  EXPECT_EQ(Arg<void*>(dkdv, 2), Fake(2));   // k
  EXPECT_EQ(Arg<void*>(dkdv, 3), Fake(3));   // v
  EXPECT_EQ(Arg<void*>(dkdv, 4), Fake(6));   // dout
  EXPECT_EQ(Arg<void*>(dkdv, 5), Fake(5));   // lse
  EXPECT_EQ(Arg<void*>(dkdv, 6), Fake(10));  // delta
  EXPECT_EQ(Arg<void*>(dkdv, 7), Fake(8));   // dk
  EXPECT_EQ(Arg<void*>(dkdv, 8), Fake(9));   // dv
  const RecordedLaunch& dq = recorder_.launches[2];
  const LaunchShape dq_tiles = AttentionLaunchOf<128>(AttentionPass::kDq, dims).shape;
  ExpectShape(dq, dq_tiles.blocks_x, dq_tiles.blocks_y, kAttnThreads);
  ExpectAttentionDims(dq, shape);
  EXPECT_EQ(Arg<void*>(dq, 1), Fake(1));   // q
  EXPECT_EQ(Arg<void*>(dq, 2), Fake(2));   // k
  EXPECT_EQ(Arg<void*>(dq, 3), Fake(3));   // v
  EXPECT_EQ(Arg<void*>(dq, 4), Fake(6));   // dout
  EXPECT_EQ(Arg<void*>(dq, 5), Fake(5));   // lse
  EXPECT_EQ(Arg<void*>(dq, 6), Fake(10));  // delta
  EXPECT_EQ(Arg<void*>(dq, 7), Fake(7));   // dq
}

}  // namespace
}  // namespace megatrain::kernels::cuda
