// The watch line: no "val" before the first evaluation, and a redraw fits one terminal row; the
// plan text names the devices of a data-parallel job; the daemon's status lists every device.
#include "client/render.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

namespace megatrain::client {
namespace {

v1::ProgressEvent Event(double validation_loss, const std::string& message) {
  v1::ProgressEvent e;
  e.set_job_id("job-000001");
  e.set_state(v1::RUNNING);
  e.set_message(message);
  e.mutable_progress()->set_step(3);
  e.mutable_progress()->set_total_steps(10);
  e.mutable_progress()->set_loss(2.5);
  e.mutable_progress()->set_validation_loss(validation_loss);
  return e;
}

TEST(RenderTest, NoValidationLossBeforeTheFirstEvaluation) {
  const std::string before =
      ProgressLine(Event(std::numeric_limits<double>::quiet_NaN(), ""), false);
  EXPECT_EQ(before.find("val"), std::string::npos) << before;
  EXPECT_EQ(before.find("nan"), std::string::npos) << before;
  const std::string after = ProgressLine(Event(1.25, ""), false);
  EXPECT_NE(after.find("val 1.2500"), std::string::npos) << after;
}

TEST(RenderTest, FitToWidthCutsToOneRowWithoutSplittingCharacters) {
  EXPECT_EQ(FitToWidth("abcdef", 4), "abcd");
  EXPECT_EQ(FitToWidth("abc", 10), "abc");
  EXPECT_EQ(FitToWidth("a\nb\tc", 0), "a b c");
  // "é" is two bytes and one column; "…" three bytes and one column.
  EXPECT_EQ(FitToWidth("\xc3\xa9\xc3\xa9\xe2\x80\xa6x", 3), "\xc3\xa9\xc3\xa9\xe2\x80\xa6");
  const std::string line = ProgressLine(Event(1.0, std::string(500, 'm')), true);
  EXPECT_EQ(FitToWidth(line, 80).size(), 80u);
}

TEST(RenderTest, PlanTextNamesTheDevicesOnlyWhenMoreThanOne) {
  v1::PlanResponse plan;
  plan.set_parameters(1000);
  plan.set_devices(1);
  EXPECT_EQ(PlanText(plan).find("devices"), std::string::npos) << PlanText(plan);
  plan.set_devices(4);
  EXPECT_NE(PlanText(plan).find("devices: 4\n"), std::string::npos) << PlanText(plan);
}

TEST(RenderTest, JobDetailsAndPlanShowTheSpeculativeUpdateOnlyWhenAsked) {
  v1::Job job;
  job.set_id("job-000001");
  EXPECT_EQ(JobDetails(job).find("speculative"), std::string::npos) << JobDetails(job);
  job.mutable_spec()->set_speculative_update(true);
  EXPECT_NE(JobDetails(job).find("speculative update: on\n"), std::string::npos) << JobDetails(job);
  v1::PlanResponse plan;
  EXPECT_EQ(PlanText(plan).find("speculative"), std::string::npos) << PlanText(plan);
  plan.set_speculative_update("speculative update on: alternate master/m/v regions 1.00 GiB");
  EXPECT_NE(PlanText(plan).find("speculative update on: alternate master/m/v regions 1.00 GiB\n"),
            std::string::npos)
      << PlanText(plan);
}

TEST(RenderTest, DaemonStatusListsEveryDeviceWithItsArenaAndHealth) {
  v1::DaemonStatus status;
  status.set_device("cpu");
  status.set_healthy(false);
  for (uint32_t d = 0; d < 2; ++d) {
    v1::DeviceStatus* device = status.add_devices();
    device->set_index(d);
    device->set_name("cpu");
    device->set_arena_capacity_bytes(uint64_t{1} << 30);
    device->set_arena_in_use_bytes(d == 0 ? uint64_t{3} << 20 : 0);
    device->set_healthy(d == 0);
    if (d == 1) device->set_unhealthy_reason("injected fault");
  }
  const std::string text = DaemonStatusText(status);
  EXPECT_NE(text.find("device 0:      cpu  arena 3.0 MiB of 1.00 GiB  healthy\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("device 1:      cpu  arena 0 B of 1.00 GiB  UNHEALTHY (injected fault)\n"),
            std::string::npos)
      << text;
  // An older daemon (no devices field): only the one `device` line.
  EXPECT_EQ(DaemonStatusText(v1::DaemonStatus()).find("device 0:"), std::string::npos);
}

}  // namespace
}  // namespace megatrain::client
