// ValidateHosts: host entries parsed into names and rank counts (mpirun's --host value), every
// way a name could reach mpirun as an option or a far shell refused naming the entry, rank
// counts bounded, zero1 only with hosts, eval prompts refused with hosts.
#include "service/hosts_spec_validation.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::service {
namespace {

using ::testing::HasSubstr;

// As a daemon whose allowed_hosts are node1, 10.0.0.7 and gpu-box_3.lab validates.
absl::Status Validate(std::initializer_list<std::string> hosts, ValidatedJob& job,
                      bool zero1 = false) {
  v1::JobSpec spec;
  for (const std::string& h : hosts) spec.add_hosts(h);
  spec.set_zero1(zero1);
  return ValidateHosts(spec, {"node1", "10.0.0.7", "gpu-box_3.lab"}, /*any_host=*/false, job);
}

TEST(HostsSpecValidationTest, ParsesNamesAndRanks) {
  ValidatedJob job;
  ASSERT_TRUE(Validate({"node1:2", "10.0.0.7", "gpu-box_3.lab:64"}, job).ok());
  ASSERT_EQ(job.hosts.size(), 3u);
  EXPECT_EQ(job.hosts[0].name, "node1");
  EXPECT_EQ(job.hosts[0].ranks, 2);
  EXPECT_EQ(job.hosts[1].ranks, 1);
  EXPECT_EQ(job.ranks, 67);
  EXPECT_EQ(MpirunHostList(job.hosts), "node1:2,10.0.0.7:1,gpu-box_3.lab:64");
}

TEST(HostsSpecValidationTest, NoHostsIsOneRankInTheDaemon) {
  ValidatedJob job;
  ASSERT_TRUE(Validate({}, job).ok());
  EXPECT_TRUE(job.hosts.empty());
  EXPECT_EQ(job.ranks, 1);
}

TEST(HostsSpecValidationTest, RefusesWhatCouldBeAnOptionOrReachAShell) {
  for (const std::string bad :
       {"", "-np", "--host", "a b", "a;b", "$(x)", "a/b", "a,b", ":2", "node1:0", "node1:65",
        "node1:x", "node1:2:3", "node1:-1", "node1:"}) {
    ValidatedJob job;
    const absl::Status s = Validate({bad}, job);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "'" << bad << "'";
    EXPECT_THAT(s.message(), HasSubstr("hosts")) << s;
  }
}

TEST(HostsSpecValidationTest, Zero1NeedsHosts) {
  ValidatedJob job;
  const absl::Status s = Validate({}, job, /*zero1=*/true);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("zero1: true without hosts"));
  EXPECT_TRUE(Validate({"localhost:2"}, job, /*zero1=*/true).ok());
}

TEST(HostsSpecValidationTest, EvalPromptsAreRefusedWithHosts) {
  v1::JobSpec spec;
  spec.add_hosts("localhost:2");
  spec.mutable_data()->add_eval_prompts("hello");
  ValidatedJob job;
  const absl::Status s = ValidateHosts(spec, {}, false, job);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("data.eval_prompts"));
}

TEST(HostsSpecValidationTest, SpeculativeUpdateIsRefusedWithHosts) {
  v1::JobSpec spec;
  spec.add_hosts("localhost:2");
  spec.set_speculative_update(true);
  ValidatedJob job;
  const absl::Status s = ValidateHosts(spec, {}, false, job);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("speculative_update"));
}

TEST(HostsSpecValidationTest, OnlyAllowedHostsBesidesLocalhost) {
  ValidatedJob job;
  EXPECT_TRUE(Validate({"localhost:3", "node1"}, job).ok());
  const absl::Status s = Validate({"node1", "node9:2"}, job);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("hosts: 'node9:2' is not one of the daemon's allowed_hosts"));
  v1::JobSpec spec;
  spec.add_hosts("node9");
  EXPECT_THAT(ValidateHosts(spec, {}, false, job).message(), HasSubstr("localhost"));
  // A plan for another machine launches nothing.
  EXPECT_TRUE(ValidateHosts(spec, {}, /*any_host=*/true, job).ok());
}

}  // namespace
}  // namespace megatrain::service
