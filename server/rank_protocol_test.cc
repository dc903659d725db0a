// The rank protocol: every event a rank writes reaches the daemon's observer as in a run in the
// daemon's process (a step's report whole, NaN validation loss included), the result, a stop and
// the first rank error are kept with rank and host named, and lines that are not events (the
// launcher's own words, a forged or broken event) become plain kept lines.
#include "server/rank_protocol.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

class Recorder final : public engine::TrainingObserver {
 public:
  void OnLine(const std::string& line, bool keep) override { lines.emplace_back(line, keep); }
  void OnStep(const engine::StepReport& report, double validation_loss) override {
    steps.push_back(report);
    validation.push_back(validation_loss);
  }
  void OnCheckpoint(uint64_t step, const std::string& path) override {
    checkpoints.emplace_back(step, path);
  }
  std::vector<std::pair<std::string, bool>> lines;
  std::vector<engine::StepReport> steps;
  std::vector<double> validation;
  std::vector<std::pair<uint64_t, std::string>> checkpoints;
};

// Feeds `text` (whole lines, each ending in '\n') to `events`.
void Feed(RankEvents& events, const std::string& text) {
  size_t start = 0;
  for (size_t nl = text.find('\n'); nl != std::string::npos; nl = text.find('\n', start)) {
    events.OnOutputLine(text.substr(start, nl - start));
    start = nl + 1;
  }
}

TEST(RankProtocolTest, EventsReachTheObserver) {
  Recorder recorder;
  RankEvents events(recorder);
  engine::StepReport report;
  report.step = 7;
  report.loss = 2.5;
  report.communication_bytes = 123456789012ull;
  report.devices.resize(2);
  report.devices[1].link_bytes = 42;
  engine::TrainingRunResult result;
  result.final_validation_loss = 1.25;
  result.last_checkpoint = "/x/step-7";
  result.steps_run = 7;
  for (const std::string& line : {RankLineEvent("model: 10 parameters", true),
                                  RankStepEvent(report, 3.5), RankStepEvent(report, std::nan("")),
                                  RankCheckpointEvent(7, "/x/step-7"), RankResultEvent(result)}) {
    ASSERT_EQ(line.back(), '\n');
    ASSERT_EQ(line.find('\n'), line.size() - 1) << "one line per event";
    Feed(events, line);
  }
  EXPECT_THAT(recorder.lines, ElementsAre(Pair("model: 10 parameters", true)));
  ASSERT_EQ(recorder.steps.size(), 2u);
  EXPECT_EQ(recorder.steps[0].step, 7u);
  EXPECT_EQ(recorder.steps[0].loss, 2.5);
  EXPECT_EQ(recorder.steps[0].communication_bytes, 123456789012ull);
  ASSERT_EQ(recorder.steps[0].devices.size(), 2u);
  EXPECT_EQ(recorder.steps[0].devices[1].link_bytes, 42u);
  EXPECT_EQ(recorder.validation[0], 3.5);
  EXPECT_TRUE(std::isnan(recorder.validation[1]));
  EXPECT_THAT(recorder.checkpoints, ElementsAre(Pair(7u, "/x/step-7")));
  ASSERT_TRUE(events.result().has_value());
  EXPECT_EQ(events.result()->final_validation_loss, 1.25);
  EXPECT_EQ(events.result()->last_checkpoint, "/x/step-7");
  EXPECT_EQ(events.result()->steps_run, 7u);
  EXPECT_FALSE(events.first_error().has_value());
  EXPECT_FALSE(events.stopped().has_value());
}

TEST(RankProtocolTest, TheFirstErrorNamesRankAndHost) {
  Recorder recorder;
  RankEvents events(recorder);
  Feed(events, RankErrorEvent(1, "node2", absl::ResourceExhaustedError("no room")));
  Feed(events, RankErrorEvent(0, "node1", absl::AbortedError("later")));
  ASSERT_TRUE(events.first_error().has_value());
  EXPECT_EQ(events.first_error()->code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(events.first_error()->message(), "rank 1 on node2: no room");
  ASSERT_EQ(recorder.lines.size(), 2u);  // both are shown
  EXPECT_EQ(recorder.lines[1].first, "rank 0 on node1: later");
  Feed(events, RankErrorEvent(-1, "node3", absl::NotFoundError("no job file")));
  EXPECT_EQ(recorder.lines[2].first, "a rank before MPI on node3: no job file");
}

TEST(RankProtocolTest, StopIsKept) {
  Recorder recorder;
  RankEvents events(recorder);
  Feed(events, RankStoppedEvent("stopped before step 3 (checkpoint written)"));
  ASSERT_TRUE(events.stopped().has_value());
  EXPECT_THAT(*events.stopped(), HasSubstr("checkpoint written"));
}

TEST(RankProtocolTest, OtherLinesArePlainLines) {
  Recorder recorder;
  RankEvents events(recorder);
  for (const std::string line :
       {"mpirun noticed that process rank 1 with PID 7 on node x exited on signal 9",
        "{\"step\": {\"loss\": \"x\"}}", "{\"checkpoint\": {\"step\": \"a\"}}", "[1, 2]",
        "{\"result\": 3}", "{}"}) {
    events.OnOutputLine(line);
  }
  EXPECT_TRUE(recorder.steps.empty());
  EXPECT_TRUE(recorder.checkpoints.empty());
  EXPECT_FALSE(events.result().has_value());
  EXPECT_EQ(recorder.lines.size(), 6u);
  events.OnOutputLine("");  // nothing
  EXPECT_EQ(recorder.lines.size(), 6u);
}

TEST(RankProtocolTest, InvalidUtf8IsReplacedNotThrown) {
  Recorder recorder;
  RankEvents events(recorder);
  Feed(events, RankLineEvent(std::string("cut \xe2\x82", 6), false));
  ASSERT_EQ(recorder.lines.size(), 1u);
  EXPECT_THAT(recorder.lines[0].first, HasSubstr("cut "));
  EXPECT_FALSE(recorder.lines[0].second);
}

}  // namespace
}  // namespace megatrain::server
