// Tests of the StepReport and TrainingRunResult JSON codec: lossless round trips through a JSON
// line.
#include "engine/train/step_report_json.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

namespace megatrain::engine {
namespace {

// Doubles compare by bit pattern: "equal" must not hide a last-digit loss or a lost -0.
uint64_t Bits(double value) { return std::bit_cast<uint64_t>(value); }

// Through the text form, as the pipe carries it.
nlohmann::json ThroughLine(const nlohmann::json& value) {
  const std::string line = value.dump();
  EXPECT_EQ(line.find('\n'), std::string::npos);
  return nlohmann::json::parse(line);
}

StepReport FullReport() {
  StepReport r;
  r.step = 18446744073709551615ull;
  r.loss = 0.1;
  r.valid_tokens = 9223372036854775807ll;
  r.tokens = -9223372036854775807ll - 1;
  r.grad_norm = 1e-300;
  r.clip_coefficient = 1.0 / 3.0;
  r.learning_rate = 3e-4;
  r.skipped = true;
  r.speculated_entries = 2147483647;
  r.speculation_committed = true;
  r.speculation_seconds = 5e-324;  // the smallest subnormal
  r.no_counted_targets = true;
  r.skipped_total = 18446744073709551614ull;
  r.step_seconds = std::numeric_limits<double>::max();
  r.tokens_per_second = 12345.678901234567;
  r.previous_update_wait_seconds = -0.0;
  r.layers.resize(2);
  r.layers[0] = {.copy_in_seconds = 0.2,
                 .compute_seconds = 0.3,
                 .copy_out_seconds = 0.4,
                 .stall_seconds = 0.5,
                 .optimizer_seconds = 0.6};
  r.layers[1] = {.copy_in_seconds = 1.2,
                 .compute_seconds = 1.3,
                 .copy_out_seconds = 1.4,
                 .stall_seconds = 1.5,
                 .optimizer_seconds = 1.6};
  r.total_stall_seconds = 2.7;
  r.total_copy_in_seconds = 2.8;
  r.device_arena_peak_bytes = 18446744073709551613ull;
  r.device_arena_bytes = 9223372036854775808ull;  // INT64_MAX + 1
  r.pinned_host_bytes = 3;
  r.pageable_host_bytes = 4;
  r.optimizer_seconds = 2.9;
  r.nvme_bytes_read = 5;
  r.nvme_bytes_written = 6;
  r.nvme_wait_seconds = 3.1;
  r.communication_seconds = 3.2;
  r.communication_bytes = 7;
  r.activation_blocks = {{.first_layer = 0, .num_layers = 4, .mode = "keep", .reason = "fits"},
                         {.first_layer = 4,
                          .num_layers = 8,
                          .mode = "recompute",
                          .reason = "tight \"memory\"\n\xc3\xa9"}};
  r.devices = {{.stall_seconds = 4.1,
                .copy_in_seconds = 4.2,
                .compute_seconds = 4.3,
                .turn_wait_seconds = 4.4,
                .reduce_seconds = 4.5,
                .link_bytes = 18446744073709551615ull,
                .micro_batches = 8},
               {.stall_seconds = 5.1,
                .copy_in_seconds = 5.2,
                .compute_seconds = 5.3,
                .turn_wait_seconds = 5.4,
                .reduce_seconds = 5.5,
                .link_bytes = 9,
                .micro_batches = -3}};
  return r;
}

TEST(StepReportJsonTest, EveryFieldRoundTripsExactly) {
  const StepReport a = FullReport();
  const absl::StatusOr<StepReport> parsed = StepReportFromJson(ThroughLine(StepReportToJson(a)));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const StepReport& b = *parsed;

  EXPECT_EQ(b.step, a.step);
  EXPECT_EQ(Bits(b.loss), Bits(a.loss));
  EXPECT_EQ(b.valid_tokens, a.valid_tokens);
  EXPECT_EQ(b.tokens, a.tokens);
  EXPECT_EQ(Bits(b.grad_norm), Bits(a.grad_norm));
  EXPECT_EQ(Bits(b.clip_coefficient), Bits(a.clip_coefficient));
  EXPECT_EQ(Bits(b.learning_rate), Bits(a.learning_rate));
  EXPECT_EQ(b.skipped, a.skipped);
  EXPECT_EQ(b.speculated_entries, a.speculated_entries);
  EXPECT_EQ(b.speculation_committed, a.speculation_committed);
  EXPECT_EQ(Bits(b.speculation_seconds), Bits(a.speculation_seconds));
  EXPECT_EQ(b.no_counted_targets, a.no_counted_targets);
  EXPECT_EQ(b.skipped_total, a.skipped_total);
  EXPECT_EQ(Bits(b.step_seconds), Bits(a.step_seconds));
  EXPECT_EQ(Bits(b.tokens_per_second), Bits(a.tokens_per_second));
  EXPECT_EQ(Bits(b.previous_update_wait_seconds), Bits(a.previous_update_wait_seconds));
  ASSERT_EQ(b.layers.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(Bits(b.layers[i].copy_in_seconds), Bits(a.layers[i].copy_in_seconds));
    EXPECT_EQ(Bits(b.layers[i].compute_seconds), Bits(a.layers[i].compute_seconds));
    EXPECT_EQ(Bits(b.layers[i].copy_out_seconds), Bits(a.layers[i].copy_out_seconds));
    EXPECT_EQ(Bits(b.layers[i].stall_seconds), Bits(a.layers[i].stall_seconds));
    EXPECT_EQ(Bits(b.layers[i].optimizer_seconds), Bits(a.layers[i].optimizer_seconds));
  }
  EXPECT_EQ(Bits(b.total_stall_seconds), Bits(a.total_stall_seconds));
  EXPECT_EQ(Bits(b.total_copy_in_seconds), Bits(a.total_copy_in_seconds));
  EXPECT_EQ(b.device_arena_peak_bytes, a.device_arena_peak_bytes);
  EXPECT_EQ(b.device_arena_bytes, a.device_arena_bytes);
  EXPECT_EQ(b.pinned_host_bytes, a.pinned_host_bytes);
  EXPECT_EQ(b.pageable_host_bytes, a.pageable_host_bytes);
  EXPECT_EQ(Bits(b.optimizer_seconds), Bits(a.optimizer_seconds));
  EXPECT_EQ(b.nvme_bytes_read, a.nvme_bytes_read);
  EXPECT_EQ(b.nvme_bytes_written, a.nvme_bytes_written);
  EXPECT_EQ(Bits(b.nvme_wait_seconds), Bits(a.nvme_wait_seconds));
  EXPECT_EQ(Bits(b.communication_seconds), Bits(a.communication_seconds));
  EXPECT_EQ(b.communication_bytes, a.communication_bytes);
  ASSERT_EQ(b.activation_blocks.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(b.activation_blocks[i].first_layer, a.activation_blocks[i].first_layer);
    EXPECT_EQ(b.activation_blocks[i].num_layers, a.activation_blocks[i].num_layers);
    EXPECT_EQ(b.activation_blocks[i].mode, a.activation_blocks[i].mode);
    EXPECT_EQ(b.activation_blocks[i].reason, a.activation_blocks[i].reason);
  }
  ASSERT_EQ(b.devices.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(Bits(b.devices[i].stall_seconds), Bits(a.devices[i].stall_seconds));
    EXPECT_EQ(Bits(b.devices[i].copy_in_seconds), Bits(a.devices[i].copy_in_seconds));
    EXPECT_EQ(Bits(b.devices[i].compute_seconds), Bits(a.devices[i].compute_seconds));
    EXPECT_EQ(Bits(b.devices[i].turn_wait_seconds), Bits(a.devices[i].turn_wait_seconds));
    EXPECT_EQ(Bits(b.devices[i].reduce_seconds), Bits(a.devices[i].reduce_seconds));
    EXPECT_EQ(b.devices[i].link_bytes, a.devices[i].link_bytes);
    EXPECT_EQ(b.devices[i].micro_batches, a.devices[i].micro_batches);
  }
}

TEST(StepReportJsonTest, KeysAreTheFieldNames) {
  const nlohmann::json json = StepReportToJson(FullReport());
  EXPECT_EQ(json.at("step").get<uint64_t>(), 18446744073709551615ull);
  EXPECT_EQ(json.at("layers").at(1).at("optimizer_seconds").get<double>(), 1.6);
  EXPECT_EQ(json.at("activation_blocks").at(1).at("mode"), "recompute");
  EXPECT_EQ(json.at("devices").at(0).at("micro_batches"), 8);
  EXPECT_EQ(json.size(), 31u);  // every StepReport field
}

TEST(StepReportJsonTest, NonFiniteDoublesRoundTripAsStrings) {
  StepReport a;
  a.loss = std::numeric_limits<double>::quiet_NaN();
  a.grad_norm = std::numeric_limits<double>::infinity();
  a.step_seconds = -std::numeric_limits<double>::infinity();
  a.layers.resize(1);
  a.layers[0].stall_seconds = std::numeric_limits<double>::quiet_NaN();

  const nlohmann::json json = StepReportToJson(a);
  EXPECT_EQ(json.at("loss"), "nan");
  EXPECT_EQ(json.at("grad_norm"), "inf");
  EXPECT_EQ(json.at("step_seconds"), "-inf");

  const absl::StatusOr<StepReport> b = StepReportFromJson(ThroughLine(json));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(std::isnan(b->loss));
  EXPECT_EQ(b->grad_norm, std::numeric_limits<double>::infinity());
  EXPECT_EQ(b->step_seconds, -std::numeric_limits<double>::infinity());
  ASSERT_EQ(b->layers.size(), 1u);
  EXPECT_TRUE(std::isnan(b->layers[0].stall_seconds));
}

TEST(StepReportJsonTest, MissingKeysKeepDefaults) {
  const absl::StatusOr<StepReport> parsed = StepReportFromJson(nlohmann::json::object());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const StepReport defaults;
  EXPECT_EQ(parsed->step, defaults.step);
  EXPECT_EQ(parsed->loss, defaults.loss);
  EXPECT_EQ(parsed->clip_coefficient, 1.0);  // a non-zero default
  EXPECT_FALSE(parsed->skipped);
  EXPECT_TRUE(parsed->layers.empty());
  EXPECT_TRUE(parsed->activation_blocks.empty());
  EXPECT_TRUE(parsed->devices.empty());

  const absl::StatusOr<StepReport> partial =
      StepReportFromJson(nlohmann::json::parse(R"({"devices": [{"micro_batches": 2}]})"));
  ASSERT_TRUE(partial.ok()) << partial.status();
  ASSERT_EQ(partial->devices.size(), 1u);
  EXPECT_EQ(partial->devices[0].micro_batches, 2);
  EXPECT_EQ(partial->devices[0].link_bytes, 0u);
}

void ExpectInvalid(const char* text, const std::string& message) {
  SCOPED_TRACE(text);
  const absl::StatusOr<StepReport> parsed = StepReportFromJson(nlohmann::json::parse(text));
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(parsed.status().message(), message);
}

TEST(StepReportJsonTest, WrongTypesNameTheKey) {
  ExpectInvalid(R"({"loss": "x"})", "step report: 'loss' is not a number");
  ExpectInvalid(R"({"layers": 3})", "step report: 'layers' is not an array");
  ExpectInvalid(R"({"skipped": 1})", "step report: 'skipped' is not a boolean");
  ExpectInvalid(R"({"step": -1})", "step report: 'step' is not an integer in range");
  ExpectInvalid(R"({"step": 1.5})", "step report: 'step' is not an integer in range");
  ExpectInvalid(R"({"speculated_entries": 2147483648})",
                "step report: 'speculated_entries' is not an integer in range");
  ExpectInvalid(R"({"layers": [{}, 7]})", "step report: 'layers[1]' is not an object");
  ExpectInvalid(R"({"devices": [{"link_bytes": "9"}]})",
                "step report: 'devices[0].link_bytes' is not an integer in range");
  ExpectInvalid(R"({"activation_blocks": [{"mode": null}]})",
                "step report: 'activation_blocks[0].mode' is not a string");
  ExpectInvalid(R"([1])", "step report: the value is not an object");
}

TEST(TrainingRunResultJsonTest, RoundTrips) {
  TrainingRunResult a;
  a.unigram_entropy_nats = 0.1;
  a.initial_validation_loss = std::numeric_limits<double>::quiet_NaN();  // no validation windows
  a.final_validation_loss = std::numeric_limits<double>::infinity();
  a.final_train_loss = 1e-300;
  a.tokens_per_second = 12345.678;
  a.resumed_from_step = 18446744073709551615ull;
  a.last_checkpoint = "/x/step-000000000003";
  a.parameters = 9223372036854775807;
  a.steps_run = 7;
  a.speculations_committed = 2;
  a.speculations_discarded = 5;
  const nlohmann::json json = TrainingRunResultToJson(a);
  EXPECT_EQ(json.size(), 11u);
  const absl::StatusOr<TrainingRunResult> b = TrainingRunResultFromJson(ThroughLine(json));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(std::bit_cast<uint64_t>(b->unigram_entropy_nats),
            std::bit_cast<uint64_t>(a.unigram_entropy_nats));
  EXPECT_TRUE(std::isnan(b->initial_validation_loss));
  EXPECT_EQ(b->final_validation_loss, a.final_validation_loss);
  EXPECT_EQ(std::bit_cast<uint64_t>(b->final_train_loss),
            std::bit_cast<uint64_t>(a.final_train_loss));
  EXPECT_EQ(b->tokens_per_second, a.tokens_per_second);
  EXPECT_EQ(b->resumed_from_step, a.resumed_from_step);
  EXPECT_EQ(b->last_checkpoint, a.last_checkpoint);
  EXPECT_EQ(b->parameters, a.parameters);
  EXPECT_EQ(b->steps_run, a.steps_run);
  EXPECT_EQ(b->speculations_committed, a.speculations_committed);
  EXPECT_EQ(b->speculations_discarded, a.speculations_discarded);
}

TEST(TrainingRunResultJsonTest, MissingAndWrongKeys) {
  const absl::StatusOr<TrainingRunResult> empty =
      TrainingRunResultFromJson(nlohmann::json::object());
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->steps_run, 0u);
  EXPECT_TRUE(empty->last_checkpoint.empty());

  const absl::StatusOr<TrainingRunResult> bad =
      TrainingRunResultFromJson(nlohmann::json::parse(R"({"steps_run": -1})"));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "run result: 'steps_run' is not an integer in range");
}

TEST(NumberJsonTest, NonFiniteNumbersRoundTrip) {
  for (double v :
       {2.5, std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()}) {
    const absl::StatusOr<double> back = NumberFromJson(ThroughLine(NumberToJson(v)));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, v);
  }
  const absl::StatusOr<double> nan =
      NumberFromJson(ThroughLine(NumberToJson(std::numeric_limits<double>::quiet_NaN())));
  ASSERT_TRUE(nan.ok()) << nan.status();
  EXPECT_TRUE(std::isnan(*nan));
  EXPECT_FALSE(NumberFromJson(nlohmann::json("x")).ok());
}

}  // namespace
}  // namespace megatrain::engine
