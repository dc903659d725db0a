// Real jobs on the daemon's one CPU device (DeviceJobEngine, in-process daemon): pre-tokenized
// token files (u16 and llm.c), a JSONL corpus, and the NVMe tier on a disk directory, whose run
// must end with exactly the RAM run's losses. Jobs run one after another on the same device,
// which is empty again after each.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "engine/tiers/direct_io_directory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/job_engine.h"
#include "tests/server/test_daemon.h"

namespace megatrain::server::testing {
namespace {

nlohmann::json ReadResult(const std::string& output_dir) {
  std::ifstream in(output_dir + "/result.json");
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str(), nullptr, false);
}

class DataSourcesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DeviceJobEngineOptions options;
    options.state_dir = daemon_.settings().state_dir;
    options.device = daemon_.settings().device;
    absl::StatusOr<std::unique_ptr<DeviceJobEngine>> engine = DeviceJobEngine::Create(options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    daemon_.Start(engine_.get());
  }

  // A 4-step job of batch 2 x 32 tokens over whatever data `spec` is given.
  v1::JobSpec Spec() {
    v1::JobSpec spec = daemon_.ValidSpec(4);
    spec.mutable_data()->clear_text_files();
    spec.mutable_data()->set_eval_windows(2);
    return spec;
  }

  // Submits, waits for the end (bounded) and checks it succeeded on an emptied device.
  v1::Job RunToEnd(const v1::JobSpec& spec) {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    v1::Job job;
    grpc::ClientContext context;
    grpc::Status submitted = daemon_.stub().SubmitJob(&context, request, &job);
    EXPECT_TRUE(submitted.ok()) << submitted.error_message();
    if (!submitted.ok()) return job;
    v1::Job done = daemon_.AwaitState(job.id(), v1::SUCCEEDED, 0, 120);
    EXPECT_EQ(done.progress().step(), spec.hyper().steps()) << done.failure_reason();
    EXPECT_EQ(done.progress().tokens(), spec.hyper().steps() * 2 * 32);
    EXPECT_EQ(engine_->device().arena_stats().in_use, 0u) << "a job left device memory behind";
    return done;
  }

  // Bytes of a repetitive English text, as token ids below 256.
  std::vector<uint16_t> Tokens(size_t count) {
    const std::string text = "the quick brown fox jumps over the lazy dog; ";
    std::vector<uint16_t> tokens(count);
    for (size_t i = 0; i < count; ++i)
      tokens[i] = static_cast<unsigned char>(text[i % text.size()]);
    return tokens;
  }

  TestDaemon daemon_{"data_sources"};
  std::unique_ptr<DeviceJobEngine> engine_;
};

TEST_F(DataSourcesTest, TokenFilesInU16AndLlmcFormats) {
  const std::vector<uint16_t> tokens = Tokens(5003);
  const std::string u16 = daemon_.root() + "/data/tokens.u16";
  std::ofstream(u16, std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  const std::string llmc = daemon_.root() + "/data/tokens.bin";
  {
    std::vector<int32_t> header(256, 0);
    header[0] = 20240520;
    header[1] = 1;  // uint16 tokens
    header[2] = static_cast<int32_t>(tokens.size());
    std::ofstream out(llmc, std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), header.size() * 4);
    out.write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  }
  v1::JobSpec spec = Spec();
  spec.mutable_data()->add_token_files(u16);
  const v1::Job raw = RunToEnd(spec);
  spec = Spec();
  spec.mutable_data()->add_token_files(llmc);
  spec.mutable_data()->set_token_format("llmc");
  const v1::Job header = RunToEnd(spec);
  // Same tokens, same seed: the two formats train identically.
  EXPECT_EQ(raw.progress().loss(), header.progress().loss());
  const nlohmann::json result = ReadResult(header.spec().output_dir());
  ASSERT_TRUE(result.is_object());
  EXPECT_LT(result["final_validation_loss"].get<double>(),
            result["initial_validation_loss"].get<double>());
  // Token files carry no corpus: no unigram entropy is computed, so none is written (not a 0).
  EXPECT_FALSE(result.contains("unigram_entropy_nats")) << result.dump();
}

TEST_F(DataSourcesTest, JsonlCorpusWithTheByteTokenizer) {
  const std::string jsonl = daemon_.root() + "/data/corpus.jsonl";
  {
    std::ofstream json(jsonl);
    for (int i = 0; i < 300; ++i) {
      json << nlohmann::json{{"text", "document " + std::to_string(i) +
                                          " tells of the quick brown fox and the lazy dog"}}
                  .dump()
           << "\n";
    }
  }
  v1::JobSpec spec = Spec();
  spec.mutable_data()->add_text_files(jsonl);
  const v1::Job done = RunToEnd(spec);
  const nlohmann::json result = ReadResult(done.spec().output_dir());
  ASSERT_TRUE(result.is_object());
  EXPECT_GT(result["final_train_loss"].get<double>(), 0.0);
  // Text: the unigram entropy of its training tokens, the bar its loss should beat.
  ASSERT_TRUE(result.contains("unigram_entropy_nats")) << result.dump();
  EXPECT_GT(result["unigram_entropy_nats"].get<double>(), 1.0);
}

TEST_F(DataSourcesTest, NvmeTierOnADiskDirectoryMatchesTheRamRun) {
  const std::string nvme = daemon_.root() + "/out/nvme";
  std::filesystem::create_directories(nvme);
  if (absl::Status usable = engine::tiers::CheckDirectIoDirectory(nvme); !usable.ok()) {
    GTEST_SKIP() << "no block-backed O_DIRECT directory under TEST_TMPDIR: " << usable;
  }
  const std::vector<uint16_t> tokens = Tokens(4001);
  const std::string u16 = daemon_.root() + "/data/nvme.u16";
  std::ofstream(u16, std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  v1::JobSpec ram_spec = Spec();
  ram_spec.mutable_data()->add_token_files(u16);
  v1::JobSpec nvme_spec = ram_spec;
  nvme_spec.set_output_dir(daemon_.root() + "/out/nvme-run");
  nvme_spec.mutable_memory()->set_nvme_dir(nvme);
  nvme_spec.mutable_memory()->set_nvme_bytes(uint64_t{1} << 30);
  nvme_spec.mutable_memory()->set_states_on_nvme(true);

  grpc::ClientContext plan_context;
  v1::PlanResponse plan;
  ASSERT_TRUE(daemon_.stub().Plan(&plan_context, nvme_spec, &plan).ok());
  int on_nvme = 0;
  for (const v1::BufferPlacement& p : plan.placements()) on_nvme += p.tier() == "nvme";
  EXPECT_EQ(on_nvme, 2) << plan.DebugString();  // Adam m and v

  const v1::Job ram = RunToEnd(ram_spec);
  const v1::Job on_disk = RunToEnd(nvme_spec);
  const nlohmann::json ram_result = ReadResult(ram.spec().output_dir());
  const nlohmann::json nvme_result = ReadResult(on_disk.spec().output_dir());
  ASSERT_TRUE(ram_result.is_object() && nvme_result.is_object());
  // Bitwise: the tier changes where m and v live, never the arithmetic.
  EXPECT_EQ(nvme_result["final_train_loss"].get<double>(),
            ram_result["final_train_loss"].get<double>());
  EXPECT_EQ(nvme_result["final_validation_loss"].get<double>(),
            ram_result["final_validation_loss"].get<double>());
}

}  // namespace
}  // namespace megatrain::server::testing
