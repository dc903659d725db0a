// CublasLtGemm: the three linear-layer products vs a double reference on odd
// shapes, beta = 1 accumulation, move semantics (skipped without a GPU).
#include "kernels/cuda/gemm.h"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "kernels/cuda/cuda_test_util.h"

namespace megatrain::kernels::cuda {
namespace {

using testing::DeviceBuffer;
using testing::ExpectClose;
using testing::FromBf16;
using testing::RandomBf16Values;
using testing::TestStream;
using testing::ToBf16;

TEST(CublasLtGemmTest, CreateReportsMissingDeviceCleanly) {
  int count = 0;
  if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0) {
    GTEST_SKIP() << "a GPU is present";
  }
  auto gemm = CublasLtGemm::Create();
  EXPECT_FALSE(gemm.ok());
}

class CublasLtGemmGpuTest : public ::testing::Test {
 protected:
  void SetUp() override { MT_SKIP_WITHOUT_CUDA(); }
};

TEST_F(CublasLtGemmGpuTest, LinearProductsMatchReference) {
  auto created = CublasLtGemm::Create();
  ASSERT_TRUE(created.ok()) << created.status();
  CublasLtGemm gemm = std::move(*created);  // exercises the move
  TestStream stream;
  const int64_t tokens = 37, in = 65, out = 129;
  const auto x = RandomBf16Values(tokens * in, 1, -1.0f, 1.0f);
  const auto w = RandomBf16Values(out * in, 2, -1.0f, 1.0f);
  const auto dy = RandomBf16Values(tokens * out, 3, -1.0f, 1.0f);
  const std::vector<float> dw_prior(out * in, 0.5f);
  DeviceBuffer<uint16_t> dx_in(ToBf16(x)), dw_in(ToBf16(w)), ddy(ToBf16(dy)), y(tokens * out),
      dx(tokens * in);
  DeviceBuffer<float> dw(dw_prior);

  ASSERT_TRUE(
      gemm.LinearForward(dx_in.get(), dw_in.get(), y.get(), tokens, in, out, stream.get()).ok());
  ASSERT_TRUE(gemm.LinearBackwardInput(ddy.get(), dw_in.get(), dx.get(), tokens, in, out,
                                       /*accumulate=*/false, stream.get())
                  .ok());
  ASSERT_TRUE(
      gemm.LinearBackwardWeight(ddy.get(), dx_in.get(), dw.get(), tokens, in, out, stream.get())
          .ok());
  ASSERT_EQ(stream.Sync(), cudaSuccess);

  std::vector<double> want_y(tokens * out, 0.0), want_dx(tokens * in, 0.0), want_dw(out * in, 0.5);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t i = 0; i < in; ++i) {
        want_y[t * out + o] += double{x[t * in + i]} * w[o * in + i];
        want_dx[t * in + i] += double{dy[t * out + o]} * w[o * in + i];
        want_dw[o * in + i] += double{dy[t * out + o]} * x[t * in + i];
      }
    }
  }
  // fp32 accumulation of <= 129 products of values in [-1, 1]; bf16 outputs
  // are rounded once.
  ExpectClose(FromBf16(y.Download()), want_y, 1e-2, 2e-2, "y");
  ExpectClose(FromBf16(dx.Download()), want_dx, 1e-2, 2e-2, "dx");
  ExpectClose(dw.Download(), want_dw, 1e-5, 1e-4, "dw (accumulated onto 0.5)");
}

TEST_F(CublasLtGemmGpuTest, RejectsDefaultStreamAndUseAfterClose) {
  auto created = CublasLtGemm::Create();
  ASSERT_TRUE(created.ok()) << created.status();
  MatmulArgs args;
  args.m = args.n = args.k = 1;
  args.a = args.b = args.c = reinterpret_cast<void*>(0x1000);
  EXPECT_EQ(created->Matmul(args, nullptr).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(created->Close().ok());
  TestStream stream;
  EXPECT_EQ(created->Matmul(args, stream.get()).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace megatrain::kernels::cuda
