// NcclStatus: codes and messages for each kind of NCCL result (no GPU needed: the error strings
// are NCCL's own, from the linked library).
#include "engine/dist/nccl_status.h"

#include <gtest/gtest.h>

#include <string>

namespace megatrain::engine::dist {
namespace {

TEST(NcclStatusTest, SuccessIsOk) { EXPECT_TRUE(NcclStatus(ncclSuccess, "ncclAllReduce", 0, "").ok()); }

TEST(NcclStatusTest, NamesRankCallAndNcclsWords) {
  const absl::Status s = NcclStatus(ncclInvalidArgument, "ncclAllReduce", 3, "invalid root 9");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  const std::string want =
      std::string("rank 3: ncclAllReduce: ") + ncclGetErrorString(ncclInvalidArgument) +
      ": invalid root 9";
  EXPECT_EQ(s.message(), want);
}

TEST(NcclStatusTest, EmptyDetailIsLeftOut) {
  const absl::Status s = NcclStatus(ncclInternalError, "ncclGroupEnd", 0, "");
  EXPECT_EQ(s.message(),
            std::string("rank 0: ncclGroupEnd: ") + ncclGetErrorString(ncclInternalError));
}

TEST(NcclStatusTest, CodesFollowTheCause) {
  EXPECT_EQ(NcclStatus(ncclInvalidUsage, "c", 0, "").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(NcclStatus(ncclRemoteError, "c", 0, "").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(NcclStatus(ncclSystemError, "c", 0, "").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(NcclStatus(ncclUnhandledCudaError, "c", 0, "").code(), absl::StatusCode::kInternal);
  EXPECT_EQ(NcclStatus(ncclInProgress, "c", 0, "").code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace megatrain::engine::dist
