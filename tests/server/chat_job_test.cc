// Fine-tuning jobs on chat JSONL through a real megatraind (in-process daemon, real
// DeviceJobEngine, the real tools/hf_chat tool in scripts/setup's venv): a tiny HF model directory
// (a checkpoint of random weights plus a byte-level BPE tokenizer and a Llama-3-style chat
// template built by tests/python/hf_chat_fixtures.py) and a chat file; the job succeeds with
// falling loss and a checkpoint that carries the tokenizer, a bad line fails it naming file:line,
// train_on_prompt changes the losses, and a job paused, restarted and resumed reuses its sample
// file and ends with the losses of a straight run, bitwise; the CLI's flags submit and plan such
// jobs, inputs swapped after the run-time check are never read, and cancelling kills the tool;
// `sample --chat` on a fine-tuned checkpoint replies as a greedy decode from transformers'
// rendering of the prompt does; a job's data.eval_prompts come back as WatchJob events, in the
// job's history and in `megatrain watch`, equal to a greedy decode of the final checkpoint, and
// leave its losses bitwise as they are without them; bad eval_prompts are refused naming them.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "engine/checkpoint/checkpoint_reader.h"
#include "engine/device/cpu_device.h"
#include "engine/model/model_config.h"
#include "engine/train/sampler.h"
#include "engine/train/trainer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/child_process.h"
#include "server/job_engine.h"
#include "tests/server/engine_jobs.h"
#include "tests/server/test_daemon.h"
#include "tests/server/test_files.h"

namespace megatrain::server::testing {
namespace {

using ::megatrain::engine::CpuDevice;
using ::megatrain::engine::DeviceOptions;
using ::megatrain::engine::LoadCheckpoint;
using ::megatrain::engine::LoadedCheckpoint;
using ::megatrain::engine::LoadModelConfig;
using ::megatrain::engine::ModelConfig;
using ::megatrain::engine::Sampler;
using ::megatrain::engine::SamplingOptions;
using ::megatrain::engine::Trainer;
using ::megatrain::engine::TrainerOptions;
using ::testing::HasSubstr;

constexpr int kConversations = 48;

std::string ChatTool() { return Runfile("tools/hf_chat/megatrain_chat_tokenize"); }

// A real engine with the real megatrain_tokenize and `chat_tool` as its chat tokenizer.
std::unique_ptr<DeviceJobEngine> MakeEngine(TestDaemon& daemon, const std::string& chat_tool) {
  return MakeDeviceEngine(daemon, Runfile("engine/data/megatrain_tokenize"), chat_tool);
}

// Conversations whose replies follow a pattern a tiny model learns in a few steps.
void WriteChat(const std::string& path) {
  std::ofstream out(path);
  for (int i = 0; i < kConversations; ++i) {
    nlohmann::json line;
    line["messages"] = {
        {{"role", "user"}, {"content", "Summarize the following text in one sentence, please."}},
        {{"role", "assistant"},
         {"content", i % 2 ? "The quick brown fox jumps over the lazy dog."
                           : "A helpful assistant answers the question and explains why."}}};
    out << line.dump() << "\n";
  }
}

// The HF model directory <data>/hf: config.json and model.safetensors of a one-step job from a
// random initialisation (vocab_size 640, above the fixture tokenizer's 600), then tokenizer.json
// and tokenizer_config.json (with its chat template) written by hf_chat_fixtures.make_llama3
// with the venv's Python. Returns "" after a failed expectation.
std::string MakeHfModel(TestDaemon& daemon) {
  const std::string data = daemon.root() + "/data";
  std::ofstream(data + "/chat_model.json")
      << R"({"model_type": "llama", "vocab_size": 640, "hidden_size": 48,
            "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 256})";
  {
    std::ofstream corpus(data + "/init.txt");
    for (int i = 0; i < 100; ++i) corpus << "the quick brown fox jumps over the lazy dog\n%\n";
  }
  v1::JobSpec init = daemon.ValidSpec(1);
  init.mutable_model()->set_config_json_path(data + "/chat_model.json");
  init.mutable_data()->clear_text_files();
  init.mutable_data()->add_text_files(data + "/init.txt");
  const v1::Job trained = daemon.AwaitState(Submit(daemon, init), v1::SUCCEEDED, 0, 120);
  const std::string checkpoint = trained.progress().last_checkpoint();
  EXPECT_FALSE(checkpoint.empty()) << trained.failure_reason();
  if (checkpoint.empty()) return "";
  const std::string hf = data + "/hf";
  std::filesystem::create_directories(hf);
  for (const char* name : {"config.json", "model.safetensors"}) {
    std::filesystem::copy_file(checkpoint + "/" + name, hf + "/" + name);
  }
  const std::string python = ReadAll(std::string(std::getenv("TEST_SRCDIR")) +
                                     "/hf_venv/python_path");
  const std::string program = "import sys; sys.path.insert(0, sys.argv[1]); "
                              "import hf_chat_fixtures as f; f.make_llama3(sys.argv[2])";
  absl::StatusOr<ChildResult> made = RunChildProcess(
      {python.substr(0, python.find_last_not_of("\n") + 1), "-c", program,
       Runfile("tests/python"), hf},
      [] { return false; });
  EXPECT_TRUE(made.ok()) << made.status();
  if (!made.ok()) return "";
  EXPECT_EQ(made->exit_code, 0) << made->err << " (run scripts/setup: it creates the venv)";
  if (made->exit_code != 0) return "";
  WriteChat(data + "/chat.jsonl");
  return hf;
}

// <data>/base: `hf`'s config, weights and tokenizer.json with a tokenizer_config.json that has
// no chat template.
std::string MakeTemplatelessCopy(TestDaemon& daemon, const std::string& hf) {
  const std::string base = daemon.root() + "/data/base";
  std::filesystem::create_directories(base);
  for (const char* name : {"config.json", "model.safetensors", "tokenizer.json"}) {
    std::filesystem::copy_file(hf + "/" + name, base + "/" + name);
  }
  std::ofstream(base + "/tokenizer_config.json") << R"({"eos_token": "<|eot_id|>"})";
  return base;
}

// Starts `daemon` on a real engine with `chat_tool` (kept in `engine`) and makes its HF model
// directory (the daemon's first job) into `hf`. Use under ASSERT_NO_FATAL_FAILURE.
void StartWithHfModel(TestDaemon& daemon, const std::string& chat_tool,
                      std::unique_ptr<DeviceJobEngine>& engine, std::string& hf) {
  engine = MakeEngine(daemon, chat_tool);
  ASSERT_NE(engine, nullptr);
  daemon.Start(engine.get());
  hf = MakeHfModel(daemon);
  ASSERT_FALSE(hf.empty());
}

v1::JobSpec ChatSpec(TestDaemon& daemon, const std::string& hf, uint64_t steps) {
  v1::JobSpec spec = daemon.ValidSpec(steps);
  spec.mutable_model()->clear_config_json_path();
  spec.mutable_model()->set_hf_directory(hf);
  spec.mutable_data()->clear_text_files();
  spec.mutable_data()->add_chat_files(daemon.root() + "/data/chat.jsonl");
  spec.mutable_data()->set_eval_windows(2);
  spec.mutable_data()->set_validation_fraction(0.125);
  spec.mutable_hyper()->set_seq_len(128);  // whole samples (about 56 tokens), two per row
  spec.mutable_hyper()->mutable_lr()->set_peak_lr(3e-3);
  spec.set_seed(5);
  return spec;
}

TEST(ChatJobTest, ChatJobSucceedsWithFallingLossAndCarriesTheTokenizer) {
  TestDaemon daemon("chat_job");
  std::unique_ptr<DeviceJobEngine> engine;
  std::string hf;
  ASSERT_NO_FATAL_FAILURE(StartWithHfModel(daemon, ChatTool(), engine, hf));

  const v1::JobSpec spec = ChatSpec(daemon, hf, 12);
  const std::string id = Submit(daemon, spec);
  const v1::Job done = daemon.AwaitState(id, v1::SUCCEEDED, 12, 180);
  // <key>.json (the tool's summary), <key>.mtsft, and the job's link to it.
  const std::string tokens_dir = spec.output_dir() + "/tokens";
  std::vector<std::string> names;
  ASSERT_NO_FATAL_FAILURE(ExpectTokenFiles(tokens_dir, id, ".mtsft", names));
  EXPECT_EQ(std::filesystem::read_symlink(tokens_dir + "/" + names[2]).string(), names[1]);
  const nlohmann::json summary = ReadJson(tokens_dir + "/" + names[0]);
  EXPECT_EQ(summary.value("samples", 0), kConversations);
  EXPECT_GT(summary.value("counted_tokens", 0), 0);
  EXPECT_LT(summary.value("counted_tokens", 0), summary.value("tokens", 0));
  EXPECT_EQ(summary.value("output_version", 0), 1);
  EXPECT_EQ(ReadAll(tokens_dir + "/" + names[1]).substr(0, 5), "MTSFT");

  const nlohmann::json result = Result(spec);
  ASSERT_TRUE(result.is_object());
  EXPECT_LT(result["final_validation_loss"].get<double>(),
            result["initial_validation_loss"].get<double>());
  EXPECT_LT(result["final_train_loss"].get<double>(),
            result["initial_validation_loss"].get<double>());
  // A sample set's loss counts only masked targets: no unigram entropy is computed or written.
  EXPECT_FALSE(result.contains("unigram_entropy_nats")) << result.dump();
  // The checkpoint loads in transformers with the tokenizer and template the model trained with.
  const std::string checkpoint = done.progress().last_checkpoint();
  ASSERT_FALSE(checkpoint.empty());
  EXPECT_EQ(ReadAll(checkpoint + "/tokenizer.json"), ReadAll(hf + "/tokenizer.json"));
  EXPECT_EQ(ReadAll(checkpoint + "/tokenizer_config.json"),
            ReadAll(hf + "/tokenizer_config.json"));

  // The sample file given back as data.sample_files (a pre-made MTSFT file): planned, then
  // trained with exactly the chat job's losses.
  const std::string premade = daemon.root() + "/data/premade.mtsft";
  std::filesystem::copy_file(tokens_dir + "/" + names[1], premade);
  v1::JobSpec samples = ChatSpec(daemon, hf, 12);
  samples.mutable_data()->clear_chat_files();
  samples.mutable_data()->add_sample_files(premade);
  {
    grpc::ClientContext context;
    v1::PlanResponse plan;
    const grpc::Status planned = daemon.stub().Plan(&context, samples, &plan);
    EXPECT_TRUE(planned.ok()) << planned.error_message();
    grpc::ClientContext chat_context;
    const grpc::Status chat_planned = daemon.stub().Plan(&chat_context, spec, &plan);
    EXPECT_TRUE(chat_planned.ok()) << chat_planned.error_message();
  }
  daemon.AwaitState(Submit(daemon, samples), v1::SUCCEEDED, 12, 180);
  ExpectSameResults(Result(samples), result, {"final_train_loss", "final_validation_loss"});
}

// `megatrain plan` / `submit` with the fine-tuning flags against the same daemon: the flags
// land in the spec the daemon keeps, a bad value is refused naming the field (exit 4).
TEST(ChatJobTest, TheCliFlagsSubmitAndPlanFineTuningJobs) {
  TestDaemon daemon("chat_cli");
  std::unique_ptr<DeviceJobEngine> engine;
  std::string hf;
  ASSERT_NO_FATAL_FAILURE(StartWithHfModel(daemon, ChatTool(), engine, hf));
  auto cli = [&](const std::string& command, const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {Runfile("client/megatrain"), command,
                                     "--socket=" + daemon.settings().socket_path,
                                     "--hf_directory=" + hf,
                                     "--chat=" + daemon.root() + "/data/chat.jsonl",
                                     "--steps=3", "--seq_len=128", "--batch_size=2",
                                     "--pack=false", "--train_on_prompt", "--overlong=truncate",
                                     "--chat_format=chat"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    absl::StatusOr<ChildResult> r = RunChildProcess(argv, [] { return false; });
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : ChildResult{};
  };
  const ChildResult plan = cli("plan", {"--json"});
  EXPECT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_THAT(plan.out, HasSubstr("parameters"));

  const ChildResult bad = cli("submit", {"--chat_format=sharegpt"});
  EXPECT_EQ(bad.exit_code, 4) << bad.err;
  EXPECT_THAT(bad.err, HasSubstr("data.chat_format"));

  const ChildResult submitted =
      cli("submit", {"--output_dir=" + daemon.root() + "/out/cli"});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
  const std::string id(absl::StripAsciiWhitespace(submitted.out));
  const v1::Job done = daemon.AwaitState(id, v1::SUCCEEDED, 3, 180);
  const v1::DataSource& data = done.spec().data();
  ASSERT_EQ(data.chat_files_size(), 1);
  EXPECT_EQ(data.chat_format(), "chat");
  EXPECT_TRUE(data.has_pack());
  EXPECT_FALSE(data.pack());
  EXPECT_TRUE(data.train_on_prompt());
  EXPECT_EQ(data.overlong(), "truncate");
  EXPECT_EQ(done.spec().model().hf_directory(), hf);
}

TEST(ChatJobTest, BadLinesAndMissingPiecesAreNamed) {
  TestDaemon daemon("chat_bad");
  std::unique_ptr<DeviceJobEngine> engine;
  std::string hf;
  ASSERT_NO_FATAL_FAILURE(StartWithHfModel(daemon, ChatTool(), engine, hf));

  // A line without an assistant reply: the job fails with the tool's FILE:LINE message.
  const std::string bad = daemon.root() + "/data/bad.jsonl";
  std::ofstream(bad) << R"({"messages": [{"role": "user", "content": "hi"}, )"
                     << R"({"role": "assistant", "content": "hello"}]})" << "\n"
                     << R"({"messages": [{"role": "user", "content": "only a question"}]})"
                     << "\n";
  v1::JobSpec spec = ChatSpec(daemon, hf, 2);
  spec.mutable_data()->clear_chat_files();
  spec.mutable_data()->add_chat_files(bad);
  const v1::Job failed = daemon.AwaitState(Submit(daemon, spec), v1::FAILED, 0, 120);
  EXPECT_THAT(failed.failure_reason(), HasSubstr("data.chat_files"));
  EXPECT_THAT(failed.failure_reason(), HasSubstr(bad + ":2:"));
  EXPECT_THAT(failed.failure_reason(), HasSubstr("assistant"));
  EXPECT_TRUE(DirEntries(spec.output_dir() + "/tokens").empty());

  // Refused at submit, naming the field.
  auto submit_error = [&](const v1::JobSpec& s) { return TrySubmit(daemon, s); };
  v1::JobSpec no_model = ChatSpec(daemon, hf, 2);
  no_model.mutable_model()->clear_hf_directory();
  no_model.mutable_model()->set_config_json_path(daemon.root() + "/data/chat_model.json");
  grpc::Status s = submit_error(no_model);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("data.chat_files"));
  EXPECT_THAT(s.error_message(), HasSubstr("model.hf_directory"));
  v1::JobSpec with_text = ChatSpec(daemon, hf, 2);
  with_text.mutable_data()->add_text_files(daemon.root() + "/data/corpus.txt");
  EXPECT_EQ(submit_error(with_text).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::JobSpec bad_overlong = ChatSpec(daemon, hf, 2);
  bad_overlong.mutable_data()->set_overlong("drop");
  s = submit_error(bad_overlong);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("data.overlong"));
  v1::JobSpec bad_format = ChatSpec(daemon, hf, 2);
  bad_format.mutable_data()->set_chat_format("sharegpt");
  s = submit_error(bad_format);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("data.chat_format"));
  v1::JobSpec text_with_pack = daemon.ValidSpec(2);
  text_with_pack.mutable_data()->set_pack(false);
  s = submit_error(text_with_pack);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("data.pack"));

  // A sample file whose ids exceed the model's vocabulary is refused at submit.
  {
    std::string big(32 + 8 * 2 + 5 * 2, '\0');
    big.replace(0, 8, std::string("MTSFT\0\0\1", 8));
    auto put = [&big](size_t at, uint64_t value, int bytes) {
      for (int i = 0; i < bytes; ++i) big[at + i] = static_cast<char>((value >> (8 * i)) & 0xff);
    };
    put(8, 1, 8);        // N
    put(16, 2, 8);       // T
    put(24, 5001, 4);    // V: ids up to 5000
    put(40, 2, 8);       // o[1] = T
    put(48, 7, 4);       // ids
    put(52, 5000, 4);
    put(57, 1, 1);       // mask of the second token
    std::ofstream(daemon.root() + "/data/big.mtsft", std::ios::binary) << big;
    v1::JobSpec too_big = ChatSpec(daemon, hf, 2);
    too_big.mutable_data()->clear_chat_files();
    too_big.mutable_data()->add_sample_files(daemon.root() + "/data/big.mtsft");
    s = submit_error(too_big);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("data.sample_files"));
    EXPECT_THAT(s.error_message(), HasSubstr("5000"));
  }

  // A directory without a chat template: chat_format=chat is refused at submit; auto passes and
  // the chat lines fail the job naming the line.
  const std::string base = MakeTemplatelessCopy(daemon, hf);
  v1::JobSpec chat_no_template = ChatSpec(daemon, base, 2);
  chat_no_template.mutable_data()->set_chat_format("chat");
  s = submit_error(chat_no_template);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("data.chat_format"));
  EXPECT_THAT(s.error_message(), HasSubstr("chat template"));
  const v1::Job no_template =
      daemon.AwaitState(Submit(daemon, ChatSpec(daemon, base, 2)), v1::FAILED, 0, 120);
  EXPECT_THAT(no_template.failure_reason(), HasSubstr("chat.jsonl:1:"));

  // A sample longer than seq_len + 1 with overlong=refuse fails the job naming the option.
  v1::JobSpec refuse = ChatSpec(daemon, hf, 2);
  refuse.mutable_hyper()->set_seq_len(8);
  refuse.mutable_data()->set_overlong("refuse");
  const v1::Job refused = daemon.AwaitState(Submit(daemon, refuse), v1::FAILED, 0, 120);
  EXPECT_THAT(refused.failure_reason(), HasSubstr("overlong=refuse"));

  // Without the tool: FAILED_PRECONDITION's message names the flag.
  std::unique_ptr<DeviceJobEngine> no_tool =
      MakeEngine(daemon, daemon.root() + "/nowhere/megatrain_chat_tokenize");
  ASSERT_NE(no_tool, nullptr);
  daemon.Restart(no_tool.get());
  const v1::Job untooled =
      daemon.AwaitState(Submit(daemon, ChatSpec(daemon, hf, 2)), v1::FAILED, 0, 120);
  EXPECT_THAT(untooled.failure_reason(), HasSubstr("chat_tokenize_binary"));
}

// Issue 16, point 2, for chat data: the chat file and the model directory's tokenizer.json,
// swapped after the run-time check (the runner's hook: a state, no timing) for an empty file
// outside the roots and for garbage, are never read: the tool gets the checked descriptors.
TEST(ChatJobTest, ChatAndTokenizerFilesSwappedAfterTheCheckAreNotRead) {
  TestDaemon daemon("chat_swap");
  const std::string data = daemon.root() + "/data";
  bool swapped = false;
  daemon.settings().test_after_input_check = [&](const std::string& id) {
    if (id != "job-000002") return;  // the chat job (the model's job is the first)
    std::filesystem::create_directories(daemon.root() + "/outside");
    std::ofstream(daemon.root() + "/outside/empty");
    std::filesystem::create_symlink(daemon.root() + "/outside/empty", data + "/chat.swap");
    std::filesystem::rename(data + "/chat.swap", data + "/chat.jsonl");
    std::ofstream(data + "/hf/tokenizer.swap") << "not a tokenizer";
    std::filesystem::rename(data + "/hf/tokenizer.swap", data + "/hf/tokenizer.json");
    swapped = true;
  };
  std::unique_ptr<DeviceJobEngine> engine;
  std::string hf;
  ASSERT_NO_FATAL_FAILURE(StartWithHfModel(daemon, ChatTool(), engine, hf));
  const v1::JobSpec spec = ChatSpec(daemon, hf, 2);
  const v1::Job done = daemon.AwaitState(Submit(daemon, spec), v1::SUCCEEDED, 2, 180);
  EXPECT_EQ(done.id(), "job-000002");
  EXPECT_TRUE(swapped);
  EXPECT_TRUE(std::filesystem::is_symlink(data + "/chat.jsonl"));
  EXPECT_EQ(ReadAll(data + "/hf/tokenizer.json"), "not a tokenizer");
  const std::vector<std::string> names = DirEntries(spec.output_dir() + "/tokens");
  ASSERT_EQ(names.size(), 3u) << ::testing::PrintToString(names);
  const nlohmann::json summary = ReadJson(spec.output_dir() + "/tokens/" + names[0]);
  EXPECT_EQ(summary.value("samples", 0), kConversations);
}

// A stand-in chat tokenizer that reports its pid through a FIFO and then sleeps: cancelling the
// job kills it (the engine polls the job's stop flag while the child runs).
TEST(ChatJobTest, CancelKillsTheChatTokenizer) {
  TestDaemon daemon("chat_cancel");
  const std::string fifo = daemon.root() + "/pid.fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const int reader = open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  const std::string script = daemon.root() + "/stuck_chat_tokenize";
  std::ofstream(script) << "#!/bin/sh\necho $$ > " << fifo << "\nexec sleep 600\n";
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  std::unique_ptr<DeviceJobEngine> engine;
  std::string hf;
  ASSERT_NO_FATAL_FAILURE(StartWithHfModel(daemon, script, engine, hf));
  const std::string id = Submit(daemon, ChatSpec(daemon, hf, 2));
  std::string text;  // bounded: 60 polls of a second
  for (int i = 0; i < 60 && text.find('\n') == std::string::npos; ++i) {
    pollfd p{reader, POLLIN, 0};
    if (poll(&p, 1, 1000) <= 0) continue;
    char buffer[32];
    const ssize_t n = read(reader, buffer, sizeof(buffer));
    if (n > 0) text.append(buffer, static_cast<size_t>(n));
  }
  close(reader);
  const pid_t pid = static_cast<pid_t>(std::atol(text.c_str()));
  ASSERT_GT(pid, 0) << "the chat tokenizer did not start";
  ASSERT_TRUE(Cancel(daemon, id).ok());
  daemon.AwaitState(id, v1::CANCELLED, 0, 60);
  EXPECT_EQ(kill(pid, 0), -1) << "chat tokenizer " << pid << " survived";
  EXPECT_EQ(errno, ESRCH);
}

TEST(ChatJobTest, TrainOnPromptChangesTheLosses) {
  TestDaemon daemon("chat_prompt");
  std::unique_ptr<DeviceJobEngine> engine;
  std::string hf;
  ASSERT_NO_FATAL_FAILURE(StartWithHfModel(daemon, ChatTool(), engine, hf));
  const v1::JobSpec assistant_only = ChatSpec(daemon, hf, 4);
  v1::JobSpec with_prompt = ChatSpec(daemon, hf, 4);
  with_prompt.mutable_data()->set_train_on_prompt(true);
  daemon.AwaitState(Submit(daemon, assistant_only), v1::SUCCEEDED, 4, 180);
  daemon.AwaitState(Submit(daemon, with_prompt), v1::SUCCEEDED, 4, 180);
  const nlohmann::json a = Result(assistant_only);
  const nlohmann::json b = Result(with_prompt);
  ASSERT_TRUE(a.is_object() && b.is_object());
  // Same weights, same samples: only which tokens count differs.
  EXPECT_NE(a["initial_validation_loss"].get<double>(), b["initial_validation_loss"].get<double>());
  EXPECT_NE(a["final_train_loss"].get<double>(), b["final_train_loss"].get<double>());
}

TEST(ChatJobTest, PausedRestartedAndResumedReusesTheSampleFileAndMatchesAStraightRun) {
  // The reference: the same job straight through, on its own daemon.
  TestDaemon reference("chat_straight");
  std::unique_ptr<DeviceJobEngine> reference_engine;
  std::string reference_hf;
  ASSERT_NO_FATAL_FAILURE(StartWithHfModel(reference, ChatTool(), reference_engine, reference_hf));

  // Held after step 3 (the runner's test hook: on state, whatever the machine's speed), paused,
  // the daemon restarted, and the job resumed from its checkpoint.
  TestDaemon daemon("chat_resume");
  daemon.settings().test_hold_after_step = 3;  // the one-step model job is not held
  std::unique_ptr<DeviceJobEngine> engine;
  std::string hf;
  ASSERT_NO_FATAL_FAILURE(StartWithHfModel(daemon, ChatTool(), engine, hf));
  // The same model bytes in both: copy the reference's directory over this one's.
  for (const char* name : {"config.json", "model.safetensors", "tokenizer.json",
                           "tokenizer_config.json"}) {
    std::filesystem::copy_file(reference_hf + "/" + name, hf + "/" + name,
                               std::filesystem::copy_options::overwrite_existing);
  }
  const v1::JobSpec straight = ChatSpec(reference, reference_hf, 10);
  reference.AwaitState(Submit(reference, straight), v1::SUCCEEDED, 10, 180);

  const v1::JobSpec spec = ChatSpec(daemon, hf, 10);
  const std::string id = Submit(daemon, spec);
  const v1::Job paused = PauseWhenHeld(daemon, id, 3, 180);
  ASSERT_EQ(paused.progress().step(), 3u);
  ASSERT_FALSE(paused.progress().last_checkpoint().empty());
  const std::string tokens_dir = spec.output_dir() + "/tokens";
  const std::vector<std::string> names = DirEntries(tokens_dir);
  ASSERT_EQ(names.size(), 3u) << ::testing::PrintToString(names);
  struct stat before {};
  ASSERT_EQ(stat((tokens_dir + "/" + names[1]).c_str(), &before), 0);

  daemon.settings().test_hold_after_step = 0;
  daemon.Restart(engine.get());
  ASSERT_TRUE(Resume(daemon, id).ok());
  daemon.AwaitState(id, v1::SUCCEEDED, 10, 180);
  struct stat after {};
  ASSERT_EQ(stat((tokens_dir + "/" + names[1]).c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino) << "the resumed run tokenized again";
  EXPECT_EQ(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec);
  EXPECT_EQ(DirEntries(tokens_dir), names);
  const nlohmann::json resumed = Result(spec);
  ASSERT_NO_FATAL_FAILURE(ExpectSameResults(resumed, Result(straight),
                                            {"final_train_loss", "final_validation_loss"}));
  EXPECT_EQ(resumed["resumed_from_step"].get<uint64_t>(), 3u);
}

// `python -c PROGRAM ARGS...` in scripts/setup's venv (transformers, no torch): its stdout as
// JSON, {} after a failed expectation.
nlohmann::json VenvPython(const std::string& program, const std::vector<std::string>& args) {
  const std::string python = ReadAll(std::string(std::getenv("TEST_SRCDIR")) +
                                     "/hf_venv/python_path");
  std::vector<std::string> argv = {python.substr(0, python.find_last_not_of("\n") + 1), "-c",
                                   program};
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<ChildResult> ran = RunChildProcess(argv, [] { return false; });
  EXPECT_TRUE(ran.ok()) << ran.status();
  if (!ran.ok()) return nlohmann::json::object();
  EXPECT_EQ(ran->exit_code, 0) << ran->err;
  return nlohmann::json::parse(ran->out, nullptr, false);
}

// `ids` decoded by transformers' tokenizer of `checkpoint` (special tokens skipped), as the
// JSON {"text": ...}; {} after a failed expectation.
nlohmann::json TransformersDecode(const std::string& checkpoint, const std::vector<int32_t>& ids) {
  return VenvPython(
      "import json, os, sys\n"
      "os.environ['HF_HUB_OFFLINE'] = os.environ['TRANSFORMERS_OFFLINE'] = '1'\n"
      "from transformers import AutoTokenizer\n"
      "t = AutoTokenizer.from_pretrained(sys.argv[1])\n"
      "ids = [int(i) for i in sys.argv[2].split(',') if i]\n"
      "print(json.dumps({'text': t.decode(ids, skip_special_tokens=True)}))\n",
      {checkpoint, absl::StrJoin(ids, ",")});
}

// A trainer on a CPU device holding `checkpoint`'s weights (the trainer is destroyed first).
struct CheckpointTrainer {
  std::unique_ptr<CpuDevice> device;
  std::unique_ptr<Trainer> trainer;
};

absl::StatusOr<CheckpointTrainer> LoadTrainer(const std::string& checkpoint, int micro_batch_size,
                                              int seq_len) {
  absl::StatusOr<ModelConfig> config = LoadModelConfig(checkpoint + "/config.json");
  if (!config.ok()) return config.status();
  DeviceOptions device_options;
  device_options.arena_bytes = 64 << 20;
  device_options.pinned_budget_bytes = 256 << 20;
  absl::StatusOr<std::unique_ptr<CpuDevice>> device = CpuDevice::Create(device_options);
  if (!device.ok()) return device.status();
  TrainerOptions options;
  options.micro_batch_size = micro_batch_size;
  options.seq_len = seq_len;
  options.collect_timeline = false;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(**device, *config, options);
  if (!trainer.ok()) return trainer.status();
  absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(checkpoint, **trainer);
  if (!loaded.ok()) return loaded.status();
  return CheckpointTrainer{*std::move(device), *std::move(trainer)};
}

// `sample --chat` on a fine-tuned checkpoint prints the reply that a greedy decode through our
// own Logits path (engine Sampler on the checkpoint) gives from the prompt ids of transformers'
// apply_chat_template(add_generation_prompt=True), decoded by transformers' tokenizer: the
// rendering, the stop at the template's eos and the decoding are checked against transformers.
// (transformers without torch cannot generate; the comparison with its generate() on the same
// checkpoint is run by hand, docs/fine_tuning.md.)
TEST(ChatJobTest, SampleChatReplyEqualsGreedyDecodeOfTheTransformersPrompt) {
  TestDaemon daemon("chat_sample");
  std::unique_ptr<DeviceJobEngine> engine;
  std::string hf;
  ASSERT_NO_FATAL_FAILURE(StartWithHfModel(daemon, ChatTool(), engine, hf));
  const v1::Job done = daemon.AwaitState(Submit(daemon, ChatSpec(daemon, hf, 12)), v1::SUCCEEDED,
                                         12, 180);
  const std::string checkpoint = done.progress().last_checkpoint();
  ASSERT_FALSE(checkpoint.empty());

  const std::string prompt = "Summarize the following text in one sentence, please.";
  const nlohmann::json rendered = VenvPython(
      "import json, os, sys\n"
      "os.environ['HF_HUB_OFFLINE'] = os.environ['TRANSFORMERS_OFFLINE'] = '1'\n"
      "from transformers import AutoTokenizer\n"
      "t = AutoTokenizer.from_pretrained(sys.argv[1])\n"
      "ids = t.apply_chat_template([{'role': 'user', 'content': sys.argv[2]}],\n"
      "                            add_generation_prompt=True, tokenize=True)\n"
      "print(json.dumps({'ids': list(ids), 'eos': t.eos_token_id}))\n",
      {checkpoint, prompt});
  ASSERT_TRUE(rendered.contains("ids") && rendered.contains("eos")) << rendered.dump();
  const std::vector<int32_t> prompt_ids = rendered["ids"].get<std::vector<int32_t>>();
  const int32_t eos = rendered["eos"].get<int32_t>();

  constexpr int kContext = 128;
  absl::StatusOr<CheckpointTrainer> loaded = LoadTrainer(checkpoint, 1, kContext);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  Sampler sampler(*loaded->trainer, kContext);

  // With the stop at eos, and without it (so that a reply of exactly 16 tokens is compared even
  // when this briefly trained model ends its turn early).
  for (const bool stop : {true, false}) {
    SCOPED_TRACE(stop ? "stopping at eos" : "16 tokens, no stop");
    SamplingOptions greedy;
    greedy.max_new_tokens = 16;
    if (stop) greedy.stop_tokens = {eos};
    absl::StatusOr<std::vector<int32_t>> reply = sampler.Generate(prompt_ids, greedy);
    ASSERT_TRUE(reply.ok()) << reply.status();
    if (!stop) {
      EXPECT_EQ(reply->size(), 16u);
    }
    if (stop && !reply->empty() && reply->back() == eos) reply->pop_back();
    const nlohmann::json text = TransformersDecode(checkpoint, *reply);
    ASSERT_TRUE(text.contains("text")) << text.dump();

    absl::StatusOr<ChildResult> sampled = RunChildProcess(
        {Runfile("engine/train/sample"), "--model=" + checkpoint, "--chat",
         "--chat_tool=" + ChatTool(), "--prompt=" + prompt, "--temperature=0", "--tokens=16",
         absl::StrCat("--context=", kContext), absl::StrCat("--stop_at_end=", stop)},
        [] { return false; });
    ASSERT_TRUE(sampled.ok()) << sampled.status();
    EXPECT_EQ(sampled->exit_code, 0) << sampled->err;
    EXPECT_EQ(sampled->out, text["text"].get<std::string>() + "\n");
  }
}

// Issue 17, point 7: two eval prompts on a 6-step chat job evaluated every 3 steps. WatchJob
// delivers one event per reply (before step 1, after steps 3 and 6; a watcher that connects late
// gets the held ones), each with its line and its EvalReply; the history holds the last round;
// `megatrain watch` prints the lines; the last round's replies equal Sampler::GenerateGreedy on
// the final checkpoint from transformers' rendering of the prompts, decoded by transformers; the
// job's losses equal those of the same job without prompts, bitwise.
TEST(ChatJobTest, EvalPromptRepliesAreJobEventsAndLeaveTrainingUnchanged) {
  TestDaemon daemon("chat_eval");
  std::unique_ptr<DeviceJobEngine> engine;
  std::string hf;
  ASSERT_NO_FATAL_FAILURE(StartWithHfModel(daemon, ChatTool(), engine, hf));
  const std::vector<std::string> prompts = {
      "Summarize the following text in one sentence, please.", "Say \"hi\"\tin 日本語!"};
  constexpr int kReplyTokens = 12;
  v1::JobSpec spec = ChatSpec(daemon, hf, 6);
  spec.mutable_hyper()->set_micro_batch_size(2);
  spec.mutable_data()->set_eval_every_steps(3);
  for (const std::string& p : prompts) spec.mutable_data()->add_eval_prompts(p);
  spec.mutable_data()->set_eval_reply_tokens(kReplyTokens);
  const std::string id = Submit(daemon, spec);

  std::vector<v1::ProgressEvent> replies;
  v1::JobState last_state = v1::JOB_STATE_UNSPECIFIED;
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(240));
    v1::WatchJobRequest request;
    request.set_id(id);
    auto reader = daemon.stub().WatchJob(&context, request);
    v1::ProgressEvent event;
    while (reader->Read(&event)) {
      last_state = event.state();
      if (event.has_eval_reply()) replies.push_back(event);
    }
    EXPECT_TRUE(reader->Finish().ok());
  }
  ASSERT_EQ(last_state, v1::SUCCEEDED) << daemon.AwaitState(id, v1::SUCCEEDED).failure_reason();
  ASSERT_EQ(replies.size(), 6u);
  for (size_t i = 0; i < replies.size(); ++i) {
    const v1::EvalReply& r = replies[i].eval_reply();
    EXPECT_EQ(r.step(), std::vector<uint64_t>({0, 0, 3, 3, 6, 6})[i]);
    EXPECT_EQ(r.index(), i % 2);
    EXPECT_EQ(r.prompt(), prompts[i % 2]);
    EXPECT_GE(r.tokens(), 1u);
    EXPECT_LE(r.tokens(), static_cast<uint32_t>(kReplyTokens));
    EXPECT_TRUE(r.stopped() || r.tokens() == static_cast<uint32_t>(kReplyTokens));
    EXPECT_THAT(replies[i].message(),
                ::testing::StartsWith(absl::StrCat("eval step ", r.step(), " [", i % 2 + 1,
                                                   "] \"", i % 2 ? "Say \\\"hi\\\"\\tin 日本語!"
                                                                  : prompts[0],
                                                   "\" -> \"")));
  }
  // The history's latest round, as the dashboard and the Python client read it.
  {
    grpc::ClientContext context;
    v1::JobRef ref;
    ref.set_id(id);
    v1::JobHistory history;
    ASSERT_TRUE(daemon.stub().GetJobHistory(&context, ref, &history).ok());
    ASSERT_EQ(history.eval_replies_size(), 2);
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(history.eval_replies(i).SerializeAsString(),
                replies[4 + static_cast<size_t>(i)].eval_reply().SerializeAsString());
    }
  }
  // `megatrain watch` of the finished job prints the held replies, one line each.
  absl::StatusOr<ChildResult> watched = RunChildProcess(
      {Runfile("client/megatrain"), "watch", id, "--socket=" + daemon.settings().socket_path},
      [] { return false; });
  ASSERT_TRUE(watched.ok()) << watched.status();
  EXPECT_EQ(watched->exit_code, 0) << watched->err;
  for (const v1::ProgressEvent& e : replies) {
    EXPECT_THAT(watched->out, HasSubstr(e.message() + "\n"));
  }

  // The last round against a greedy decode of the final checkpoint (same micro-batch shape),
  // from transformers' rendering, stopping at its eos, decoded by transformers.
  const v1::Job done = daemon.AwaitState(id, v1::SUCCEEDED, 6, 30);
  const std::string checkpoint = done.progress().last_checkpoint();
  ASSERT_FALSE(checkpoint.empty());
  const nlohmann::json rendered = VenvPython(
      "import json, os, sys\n"
      "os.environ['HF_HUB_OFFLINE'] = os.environ['TRANSFORMERS_OFFLINE'] = '1'\n"
      "from transformers import AutoTokenizer\n"
      "t = AutoTokenizer.from_pretrained(sys.argv[1])\n"
      "ids = [list(t.apply_chat_template([{'role': 'user', 'content': p}],\n"
      "                                  add_generation_prompt=True, tokenize=True))\n"
      "       for p in sys.argv[2:]]\n"
      "print(json.dumps({'ids': ids, 'eos': t.eos_token_id, 'vocab': len(t)}))\n",
      {checkpoint, prompts[0], prompts[1]});
  ASSERT_TRUE(rendered.contains("ids")) << rendered.dump();
  absl::StatusOr<CheckpointTrainer> loaded = LoadTrainer(checkpoint, 2, 128);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  SamplingOptions greedy;
  greedy.max_new_tokens = kReplyTokens;
  greedy.stop_tokens = {rendered["eos"].get<int32_t>()};
  greedy.vocab_limit = rendered["vocab"].get<int64_t>();
  absl::StatusOr<std::vector<engine::GreedyReply>> expected =
      Sampler(*loaded->trainer, 128, 2)
          .GenerateGreedy(rendered["ids"].get<std::vector<std::vector<int32_t>>>(), greedy);
  ASSERT_TRUE(expected.ok()) << expected.status();
  for (size_t i = 0; i < 2; ++i) {
    const v1::EvalReply& got = replies[4 + i].eval_reply();
    EXPECT_EQ(got.tokens(), (*expected)[i].ids.size()) << "prompt " << i;
    EXPECT_EQ(got.stopped(), (*expected)[i].stopped) << "prompt " << i;
    const nlohmann::json text = TransformersDecode(checkpoint, (*expected)[i].ids);
    ASSERT_TRUE(text.contains("text")) << text.dump();
    EXPECT_EQ(got.reply(), text["text"].get<std::string>()) << "prompt " << i;
  }

  // The same job without eval prompts: the same losses, bit for bit.
  v1::JobSpec plain = ChatSpec(daemon, hf, 6);
  plain.mutable_hyper()->set_micro_batch_size(2);
  plain.mutable_data()->set_eval_every_steps(3);
  daemon.AwaitState(Submit(daemon, plain), v1::SUCCEEDED, 6, 180);
  ExpectSameResults(Result(spec), Result(plain),
                    {"initial_validation_loss", "final_validation_loss", "final_train_loss"});
}

// data.eval_prompts and eval_reply_tokens are refused at submit, naming the field.
TEST(ChatJobTest, BadEvalPromptsAreRefusedNamingTheField) {
  TestDaemon daemon("chat_eval_bad");
  std::unique_ptr<DeviceJobEngine> engine;
  std::string hf;
  ASSERT_NO_FATAL_FAILURE(StartWithHfModel(daemon, ChatTool(), engine, hf));
  auto refused = [&](const v1::JobSpec& s, const std::string& field, const std::string& what) {
    const grpc::Status status = TrySubmit(daemon, s);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field;
    EXPECT_THAT(status.error_message(), HasSubstr(field + ": "));
    EXPECT_THAT(status.error_message(), HasSubstr(what));
  };
  auto with_prompts = [&](const std::vector<std::string>& prompts) {
    v1::JobSpec s = ChatSpec(daemon, hf, 2);
    for (const std::string& p : prompts) s.mutable_data()->add_eval_prompts(p);
    return s;
  };
  refused(with_prompts(std::vector<std::string>(9, "hi")), "data.eval_prompts", "9 prompts exceed 8");
  refused(with_prompts({"fine", ""}), "data.eval_prompts[1]", "0 bytes");
  refused(with_prompts({std::string(1025, 'x')}), "data.eval_prompts[0]", "1025 bytes");
  v1::JobSpec zero = with_prompts({"hi"});
  zero.mutable_data()->set_eval_reply_tokens(0);
  refused(zero, "data.eval_reply_tokens", "0");
  v1::JobSpec long_reply = with_prompts({"hi"});
  long_reply.mutable_data()->set_eval_reply_tokens(513);
  refused(long_reply, "data.eval_reply_tokens", "513");
  v1::JobSpec alone = ChatSpec(daemon, hf, 2);
  alone.mutable_data()->set_eval_reply_tokens(10);
  refused(alone, "data.eval_reply_tokens", "data.eval_prompts only");
  v1::JobSpec text = daemon.ValidSpec(2);
  text.mutable_data()->add_eval_prompts("hi");
  refused(text, "data.eval_prompts", "chat_files / sample_files only");

  // A model directory without a chat template: prompt/completion data trains, prompts cannot be
  // rendered.
  const std::string base = MakeTemplatelessCopy(daemon, hf);
  v1::JobSpec no_template = ChatSpec(daemon, base, 2);
  no_template.mutable_data()->add_eval_prompts("hi");
  refused(no_template, "data.eval_prompts", "chat template");
}

TEST(ChatJobTest, SampleChatNamesAMissingToolAndAModelWithoutTemplate) {
  const std::string golden = Runfile("tests/golden/llama_tiny");
  absl::StatusOr<ChildResult> no_tool = RunChildProcess(
      {Runfile("engine/train/sample"), "--model=" + golden, "--chat", "--prompt=hi"},
      [] { return false; });
  ASSERT_TRUE(no_tool.ok()) << no_tool.status();
  EXPECT_EQ(no_tool->exit_code, 1);
  EXPECT_THAT(no_tool->err, HasSubstr("--chat needs --chat_tool="));
  // The golden fixture has weights but no tokenizer files: the tool's error comes through.
  absl::StatusOr<ChildResult> no_tokenizer = RunChildProcess(
      {Runfile("engine/train/sample"), "--model=" + golden, "--chat", "--chat_tool=" + ChatTool(),
       "--prompt=hi"},
      [] { return false; });
  ASSERT_TRUE(no_tokenizer.ok()) << no_tokenizer.status();
  EXPECT_EQ(no_tokenizer->exit_code, 1);
  EXPECT_THAT(no_tokenizer->err, HasSubstr("tokenizer.json: missing"));
}

}  // namespace
}  // namespace megatrain::server::testing
