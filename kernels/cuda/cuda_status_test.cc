// CUDA/cuBLAS status mapping: codes and messages (runs without a GPU).
#include "kernels/cuda/cuda_status.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace megatrain::kernels::cuda {
namespace {

using ::testing::HasSubstr;

TEST(CudaStatusTest, SuccessIsOk) {
  EXPECT_TRUE(CudaStatus(cudaSuccess, "x").ok());
  EXPECT_TRUE(CublasStatus(CUBLAS_STATUS_SUCCESS, "x").ok());
}

TEST(CudaStatusTest, MapsCodesAndKeepsCudaMessage) {
  const absl::Status oom = CudaStatus(cudaErrorMemoryAllocation, "cudaMalloc(64 B)");
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(oom.message(), HasSubstr("cudaMalloc(64 B)"));
  EXPECT_THAT(oom.message(), HasSubstr("cudaErrorMemoryAllocation"));
  EXPECT_EQ(CudaStatus(cudaErrorInsufficientDriver, "init").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(CudaStatus(cudaErrorNoDevice, "init").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(CudaStatus(cudaErrorInvalidConfiguration, "launch").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaStatus(cudaErrorIllegalAddress, "sync").code(), absl::StatusCode::kInternal);
}

TEST(CudaStatusTest, MapsCublasCodes) {
  EXPECT_EQ(CublasStatus(CUBLAS_STATUS_ALLOC_FAILED, "gemm").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CublasStatus(CUBLAS_STATUS_NOT_INITIALIZED, "gemm").code(),
            absl::StatusCode::kUnavailable);
  const absl::Status invalid = CublasStatus(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul");
  EXPECT_EQ(invalid.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(invalid.message(), HasSubstr("cublasLtMatmul"));
  EXPECT_THAT(invalid.message(), HasSubstr("CUBLAS_STATUS_INVALID_VALUE"));
}

}  // namespace
}  // namespace megatrain::kernels::cuda
