// trainer_state.json: the previous step's gradient norm (the previous-norm clip rule's input)
// round-trips bit for bit, is optional for older checkpoints, and a bad one is refused by name.
#include "engine/checkpoint/training_state.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace megatrain::engine {
namespace {

TEST(TrainingStateTest, RoundTripsEveryCounterAndTheNormBitForBit) {
  TrainingState s;
  s.progress = {7, 6, 1, 0, 30.809637481076369};
  s.data_cursor = 99;
  s.seed = 5;
  s.job_json = R"({"name":"x"})";
  const absl::StatusOr<TrainingState> back = ParseTrainingState(TrainingStateToJson(s), "t");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->progress.step, 7u);
  EXPECT_EQ(back->progress.applied_updates, 6u);
  EXPECT_EQ(back->progress.skipped_steps, 1u);
  EXPECT_EQ(std::memcmp(&back->progress.previous_grad_norm, &s.progress.previous_grad_norm,
                        sizeof(double)),
            0);
  EXPECT_EQ(back->data_cursor, 99u);
  EXPECT_EQ(back->job_json, s.job_json);
}

TEST(TrainingStateTest, ACheckpointWithoutTheNormHasNone) {
  const absl::StatusOr<TrainingState> s = ParseTrainingState(
      R"({"version": 1, "step": 3, "applied_updates": 3, "skipped_steps": 0,
          "consecutive_skips": 0, "data_cursor": 6, "seed": 1, "job": {}})",
      "old");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->progress.previous_grad_norm, 0.0);
  // And none is written as none: the file stays what it was before the rule.
  EXPECT_EQ(TrainingStateToJson(*s).find("previous_grad_norm"), std::string::npos);
}

TEST(TrainingStateTest, ABadNormIsRefusedByName) {
  for (const char* bad : {"-1", "\"7\"", "null"}) {
    const absl::StatusOr<TrainingState> s = ParseTrainingState(
        std::string(R"({"version": 1, "step": 3, "applied_updates": 3, "skipped_steps": 0,
          "consecutive_skips": 0, "data_cursor": 6, "seed": 1, "job": {}, "previous_grad_norm": )") +
            bad + "}",
        "state.json");
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.status().message().find("state.json: \"previous_grad_norm\" must be a finite"),
              std::string::npos)
        << s.status();
  }
}

}  // namespace
}  // namespace megatrain::engine
