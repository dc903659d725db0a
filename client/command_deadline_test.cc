// The CLI's per-command deadlines (checkpoint outlasts the daemon's wait) and the exit codes of
// failed RPCs (DEADLINE_EXCEEDED is not "rejected").
#include "client/command_deadline.h"

#include <gtest/gtest.h>

#include <set>

#include "client/exit_codes.h"
#include "engine/checkpoint/provenance_verify.h"
#include "proto/rpc_waits.h"

namespace megatrain::client {
namespace {

TEST(CommandDeadlineTest, CheckpointOutlastsTheDaemonsCheckpointWait) {
  EXPECT_GT(CommandDeadline("checkpoint", 0), v1::kCheckpointRpcTimeout);
  EXPECT_EQ(CommandDeadline("status", 0), absl::Seconds(30));
  EXPECT_GE(CommandDeadline("resume", 0), absl::Seconds(120));
}

TEST(CommandDeadlineTest, TheFlagOverridesEveryCommand) {
  EXPECT_EQ(CommandDeadline("checkpoint", 7), absl::Seconds(7));
  EXPECT_EQ(CommandDeadline("list", 400), absl::Seconds(400));
}

TEST(CommandDeadlineTest, DeadlineExceededHasItsOwnExitCode) {
  EXPECT_EQ(ExitCodeForRpc(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "late")),
            kExitDeadlineExceeded);
  EXPECT_NE(kExitDeadlineExceeded, kExitRejected);
  EXPECT_EQ(ExitCodeForRpc(grpc::Status(grpc::StatusCode::UNAVAILABLE, "down")), kExitUnreachable);
  EXPECT_EQ(ExitCodeForRpc(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad")), kExitRejected);
  EXPECT_EQ(ExitCodeForRpc(grpc::Status::OK), kExitOk);
}

TEST(CommandDeadlineTest, ExitCodesAreDistinct) {
  const std::set<int> codes = {kExitOk,       kExitFailed,           kExitUsage,   kExitUnreachable,
                               kExitRejected, kExitDeadlineExceeded, kExitUnsigned};
  EXPECT_EQ(codes.size(), 7u);
  // `verify` returns the engine's codes: the same table.
  EXPECT_EQ(provenance::kVerifyOk, kExitOk);
  EXPECT_EQ(provenance::kVerifyFailed, kExitFailed);
  EXPECT_EQ(provenance::kVerifyUsage, kExitUsage);
  EXPECT_EQ(provenance::kVerifyUnsigned, kExitUnsigned);
}

}  // namespace
}  // namespace megatrain::client
