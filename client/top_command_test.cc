// TopScreen: the daemon line, jobs ordered active first with bars, cut to the terminal's rows and
// columns, and the unreachable screen.
#include "client/top_command.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"

namespace megatrain::client {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

v1::Job MakeJob(const std::string& id, v1::JobState state, uint64_t step, uint64_t total,
                int64_t finished_ms = 0) {
  v1::Job j;
  j.set_id(id);
  j.set_state(state);
  j.mutable_spec()->set_name("name-" + id);
  j.mutable_progress()->set_step(step);
  j.mutable_progress()->set_total_steps(total);
  j.mutable_progress()->set_loss(2.5);
  j.mutable_progress()->set_validation_loss(std::nan(""));
  j.mutable_progress()->set_tokens_per_second(1234);
  j.mutable_progress()->set_eta_seconds(125);
  j.set_finished_unix_ms(finished_ms);
  return j;
}

v1::DaemonStatus Status() {
  v1::DaemonStatus s;
  s.set_version("megatraind 0.1.0");
  s.set_device("cpu");
  s.set_healthy(true);
  s.set_queue_length(1);
  s.set_running_job_id("job-000003");
  v1::TierUsage* ram = s.add_memory();
  ram->set_tier("ram");
  ram->set_bytes(uint64_t{3} << 29);
  ram->set_budget_bytes(uint64_t{10} << 30);
  return s;
}

std::vector<std::string> Lines(const std::string& screen) {
  return absl::StrSplit(screen, '\n', absl::SkipEmpty());
}

TEST(TopScreenTest, ActiveJobsComeFirstWithTheirProgress) {
  const std::vector<v1::Job> jobs = {
      MakeJob("job-000001", v1::SUCCEEDED, 40, 40, 1000),
      MakeJob("job-000002", v1::FAILED, 3, 40, 2000),
      MakeJob("job-000003", v1::RUNNING, 10, 40),
      MakeJob("job-000004", v1::QUEUED, 0, 40),
  };
  const std::string screen = TopScreen(Status(), jobs, absl::UnixEpoch(), 0, 0);
  const std::vector<std::string> lines = Lines(screen);
  ASSERT_EQ(lines.size(), 8u) << screen;
  EXPECT_THAT(lines[1], HasSubstr("healthy  queue 1  running job-000003"));
  EXPECT_THAT(lines[2], HasSubstr("ram 1.5/10.0"));
  EXPECT_THAT(lines[4], HasSubstr("job-000003   RUNNING   [####............]  25%"));
  EXPECT_THAT(lines[4], HasSubstr("1234"));
  EXPECT_THAT(lines[4], HasSubstr("2m05s"));
  EXPECT_THAT(lines[5], HasSubstr("job-000004   QUEUED"));
  EXPECT_THAT(lines[5], HasSubstr("-  name-job-000004"));  // no loss before a step
  EXPECT_THAT(lines[6], HasSubstr("job-000002   FAILED"));  // newest finished first
  EXPECT_THAT(lines[7], HasSubstr("job-000001   SUCCEEDED [################] 100%"));
}

TEST(TopScreenTest, ListsEveryDeviceOfTheDaemon) {
  v1::DaemonStatus status = Status();
  for (uint32_t d = 0; d < 2; ++d) {
    v1::DeviceStatus* device = status.add_devices();
    device->set_index(d);
    device->set_name("cpu");
    device->set_arena_capacity_bytes(uint64_t{1} << 30);
    device->set_arena_in_use_bytes(d == 0 ? uint64_t{3} << 20 : 0);
    device->set_healthy(d == 0);
    if (d == 1) device->set_unhealthy_reason("injected fault");
  }
  const std::vector<v1::Job> jobs = {MakeJob("job-000003", v1::RUNNING, 10, 40)};
  const std::string screen = TopScreen(status, jobs, absl::UnixEpoch(), 0, 0);
  const std::vector<std::string> lines = Lines(screen);
  ASSERT_EQ(lines.size(), 7u) << screen;
  EXPECT_EQ(lines[3], "device 0:      cpu  arena 3.0 MiB of 1.00 GiB  healthy");
  EXPECT_EQ(lines[4], "device 1:      cpu  arena 0 B of 1.00 GiB  UNHEALTHY (injected fault)");
  EXPECT_THAT(lines[6], HasSubstr("job-000003   RUNNING"));
  // An older daemon (no devices field): no device lines.
  EXPECT_THAT(TopScreen(Status(), jobs, absl::UnixEpoch(), 0, 0), Not(HasSubstr("device 0:")));
}

TEST(TopScreenTest, FitsTheTerminal) {
  std::vector<v1::Job> jobs;
  for (int i = 0; i < 30; ++i) jobs.push_back(MakeJob("job-0000" + std::to_string(10 + i), v1::QUEUED, 0, 5));
  const std::string screen = TopScreen(Status(), jobs, absl::UnixEpoch(), 40, 12);
  const std::vector<std::string> lines = Lines(screen);
  EXPECT_LE(lines.size(), 12u);
  EXPECT_THAT(lines.back(), HasSubstr("more (megatrain list)"));
  for (const std::string& line : lines) EXPECT_LE(line.size(), 40u) << line;
}

TEST(TopScreenTest, UnhealthyAndUnreachable) {
  v1::DaemonStatus sick = Status();
  sick.set_healthy(false);
  sick.set_unhealthy_reason("device fault");
  EXPECT_THAT(TopScreen(sick, {}, absl::UnixEpoch(), 0, 0), HasSubstr("UNHEALTHY: device fault"));
  EXPECT_THAT(TopScreen(sick, {}, absl::UnixEpoch(), 0, 0), HasSubstr("no jobs"));
  const std::string down = TopScreen(v1::DaemonStatus(), {}, absl::UnixEpoch(), 0, 0,
                                     "failed to connect to all addresses");
  EXPECT_THAT(down, HasSubstr("daemon unreachable: failed to connect to all addresses"));
  EXPECT_THAT(down, Not(HasSubstr("JOB")));
}

}  // namespace
}  // namespace megatrain::client
