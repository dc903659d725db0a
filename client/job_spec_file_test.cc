// Tests of JobSpec JSON files and flag overrides.
#include "client/job_spec_file.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::client {
namespace {

TEST(JobSpecFileTest, ParsesSnakeAndCamelCaseAndOverrides) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(
      R"({"name": "a", "model": {"config_json_path": "builtin:tiny"},
          "data": {"textFiles": ["/d/one"]}, "hyper": {"steps": 7, "seq_len": 33,
          "lr": {"peak_lr": 0.001, "decay": "COSINE"}}})",
      "test");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->hyper().steps(), 7u);
  EXPECT_EQ(spec->hyper().lr().decay(), v1::LrSchedule::COSINE);
  JobSpecOverrides o;
  o.steps = 11;
  o.text_files = std::vector<std::string>{"/d/two", "/d/three"};
  ApplyOverrides(o, *spec);
  EXPECT_EQ(spec->hyper().steps(), 11u);
  EXPECT_EQ(spec->hyper().seq_len(), 33u);  // untouched
  ASSERT_EQ(spec->data().text_files_size(), 2);
  EXPECT_EQ(spec->data().text_files(1), "/d/three");
  EXPECT_EQ(spec->model().config_json_path(), "builtin:tiny");
}

// `--seed=0`, `--warmup_steps=0` and `--eval_every=0` are optional flags: given, even as 0,
// they override the spec (issue 21, point 6).
TEST(JobSpecFileTest, AnExplicitZeroOverridesTheSpec) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(
      R"({"seed": 5, "data": {"eval_every_steps": 20}, "hyper": {"lr": {"warmup_steps": 10}}})",
      "test");
  ASSERT_TRUE(spec.ok()) << spec.status();
  JobSpecOverrides o;
  o.seed = 0;
  o.warmup_steps = 0;
  o.eval_every_steps = 0;
  ApplyOverrides(o, *spec);
  EXPECT_EQ(spec->seed(), 0u);
  EXPECT_EQ(spec->hyper().lr().warmup_steps(), 0u);
  EXPECT_EQ(spec->data().eval_every_steps(), 0u);
  JobSpecOverrides unset;
  spec->set_seed(9);
  ApplyOverrides(unset, *spec);
  EXPECT_EQ(spec->seed(), 9u);
}

// The fine-tuning fields: from JSON as named in the proto, and overridden by the submit flags
// (an explicit pack=false kept as set, not dropped as a default).
TEST(JobSpecFileTest, FineTuningFieldsParseAndOverride) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(
      R"({"model": {"hf_directory": "/m"}, "data": {"chat_files": ["a.jsonl"],
          "chat_format": "chat", "train_on_prompt": true, "overlong": "refuse"}})",
      "test");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data().chat_files(0), "a.jsonl");
  EXPECT_EQ(spec->data().chat_format(), "chat");
  EXPECT_TRUE(spec->data().train_on_prompt());
  EXPECT_FALSE(spec->data().has_pack());
  EXPECT_EQ(spec->data().overlong(), "refuse");
  JobSpecOverrides o;
  o.hf_directory = "/other";
  o.chat_files = std::vector<std::string>{"b.jsonl", "c.jsonl"};
  o.chat_format = "alpaca";
  o.train_on_prompt = false;
  o.pack = false;
  o.overlong = "truncate";
  ApplyOverrides(o, *spec);
  EXPECT_EQ(spec->model().hf_directory(), "/other");
  ASSERT_EQ(spec->data().chat_files_size(), 2);
  EXPECT_EQ(spec->data().chat_files(1), "c.jsonl");
  EXPECT_EQ(spec->data().chat_format(), "alpaca");
  EXPECT_FALSE(spec->data().train_on_prompt());
  EXPECT_TRUE(spec->data().has_pack());
  EXPECT_FALSE(spec->data().pack());
  EXPECT_EQ(spec->data().overlong(), "truncate");
  JobSpecOverrides samples;
  samples.sample_files = std::vector<std::string>{"s.mtsft"};
  ApplyOverrides(samples, *spec);
  ASSERT_EQ(spec->data().sample_files_size(), 1);
  EXPECT_EQ(spec->data().sample_files(0), "s.mtsft");
}

// speculative_update: the spec file's key (both spellings) and the submit flag, which overrides
// the file either way and leaves it alone when not given.
TEST(JobSpecFileTest, SpeculativeUpdateParsesAndOverrides) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(
      R"({"speculative_update": true, "memory": {"master_on_nvme": true}})", "test");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->speculative_update());
  absl::StatusOr<v1::JobSpec> camel = ParseJobSpecJson(R"({"speculativeUpdate": true})", "test");
  ASSERT_TRUE(camel.ok()) << camel.status();
  EXPECT_TRUE(camel->speculative_update());
  ApplyOverrides(JobSpecOverrides{}, *spec);
  EXPECT_TRUE(spec->speculative_update());
  JobSpecOverrides off;
  off.speculative_update = false;
  ApplyOverrides(off, *spec);
  EXPECT_FALSE(spec->speculative_update());
  JobSpecOverrides on;
  on.speculative_update = true;
  ApplyOverrides(on, *spec);
  EXPECT_TRUE(spec->speculative_update());
  // A misspelt key is refused, not taken as "off".
  EXPECT_EQ(ParseJobSpecJson(R"({"speculative_updates": true})", "f.json").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// hosts and zero1: the spec file's keys, and the submit flags, whose hosts replace the spec's.
TEST(JobSpecFileTest, HostsAndZero1ParseAndOverride) {
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobSpecJson(R"({"hosts": ["node1:2", "node2"], "zero1": true})", "test");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->hosts_size(), 2);
  EXPECT_EQ(spec->hosts(0), "node1:2");
  EXPECT_TRUE(spec->zero1());
  JobSpecOverrides o;
  o.hosts = std::vector<std::string>{"a:4"};
  o.zero1 = false;
  ApplyOverrides(o, *spec);
  ASSERT_EQ(spec->hosts_size(), 1);
  EXPECT_EQ(spec->hosts(0), "a:4");
  EXPECT_FALSE(spec->zero1());
}

TEST(JobSpecFileTest, UnknownFieldsAndBadJsonAreErrors) {
  EXPECT_EQ(ParseJobSpecJson(R"({"stepz": 3})", "f.json").status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<v1::JobSpec> bad = ParseJobSpecJson("{not json", "f.json");
  EXPECT_THAT(bad.status().message(), ::testing::HasSubstr("f.json"));
  EXPECT_EQ(LoadJobSpecJson("/nonexistent/spec.json").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace megatrain::client
