// JobSpec.speculative_update through the daemon, on its CPU device with a real engine
// (DeviceJobEngine, in-process daemon): with the master, m and v on NVMe, with them in RAM, and
// with the master in RAM beside m and v on NVMe, the job trains, every unclipped step commits its speculation (result.json), the losses are the
// normal run's bits, and the job and its plan say it is on; a job whose placement cannot use it
// is refused at submit, naming the field.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "engine/tiers/direct_io_directory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/job_engine.h"
#include "tests/server/engine_jobs.h"
#include "tests/server/test_daemon.h"

namespace megatrain::server::testing {
namespace {

using ::testing::HasSubstr;

class SpeculativeJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = MakeDeviceEngine(daemon_, /*tokenize_binary=*/"");
    ASSERT_NE(engine_, nullptr);
    daemon_.Start(engine_.get());
    nvme_dir_ = daemon_.root() + "/out/nvme";
    std::filesystem::create_directories(nvme_dir_);
    // Bytes of a repetitive English text as u16 token ids: enough windows for 4 steps.
    const std::string text = "the quick brown fox jumps over the lazy dog; ";
    std::vector<uint16_t> tokens(4001);
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<unsigned char>(text[i % text.size()]);
    }
    tokens_ = daemon_.root() + "/data/tokens.u16";
    std::ofstream(tokens_, std::ios::binary)
        .write(reinterpret_cast<const char*>(tokens.data()),
               static_cast<std::streamsize>(tokens.size() * 2));
  }

  // A 4-step job (batch 2 x 32 tokens, no clipping), everything in RAM.
  v1::JobSpec InRamSpec(bool speculate) {
    v1::JobSpec spec = daemon_.ValidSpec(4);
    spec.mutable_data()->clear_text_files();
    spec.mutable_data()->add_token_files(tokens_);
    spec.mutable_data()->set_eval_windows(2);
    spec.set_speculative_update(speculate);
    return spec;
  }

  // The mixed form: the master in RAM, m and v on NVMe.
  v1::JobSpec StatesOnNvmeSpec(bool speculate) {
    v1::JobSpec spec = MasterOnNvmeSpec(speculate);
    spec.mutable_memory()->set_master_on_nvme(false);
    spec.mutable_memory()->set_states_on_nvme(true);
    return spec;
  }

  // The same with the master, m and v on NVMe.
  v1::JobSpec MasterOnNvmeSpec(bool speculate) {
    v1::JobSpec spec = InRamSpec(speculate);
    v1::MemoryBudgets& m = *spec.mutable_memory();
    m.set_nvme_dir(nvme_dir_);
    m.set_nvme_bytes(uint64_t{1} << 30);
    m.set_master_on_nvme(true);
    spec.set_speculative_update(speculate);
    return spec;
  }

  // Submits, waits for the end (bounded) and checks it succeeded on an emptied device.
  v1::Job RunToEnd(const v1::JobSpec& spec) {
    v1::Job job;
    const grpc::Status submitted = TrySubmit(daemon_, spec, &job);
    EXPECT_TRUE(submitted.ok()) << submitted.error_message();
    if (!submitted.ok()) return job;
    v1::Job done = daemon_.AwaitState(job.id(), v1::SUCCEEDED, 0, 120);
    EXPECT_EQ(done.progress().step(), spec.hyper().steps()) << done.failure_reason();
    EXPECT_EQ(engine_->device().arena_stats().in_use, 0u) << "a job left device memory behind";
    return done;
  }

  // Plans and runs make_spec(true) and make_spec(false) (each its own output directory): the
  // speculative update is on (in `form`), every step commits, and the losses are the normal
  // run's.
  void ExpectItTrainsCommitsEveryStepAndReportsIt(
      const std::function<v1::JobSpec(bool speculate)>& make_spec, const std::string& form) {
    const v1::JobSpec speculative_spec = make_spec(true);
    const v1::JobSpec normal_spec = make_spec(false);
    grpc::ClientContext plan_context;
    v1::PlanResponse plan;
    ASSERT_TRUE(daemon_.stub().Plan(&plan_context, speculative_spec, &plan).ok());
    EXPECT_THAT(plan.speculative_update(), HasSubstr("speculative update on: " + form))
        << plan.DebugString();
    const v1::Job normal = RunToEnd(normal_spec);
    const v1::Job speculative = RunToEnd(speculative_spec);
    EXPECT_FALSE(normal.spec().speculative_update());
    EXPECT_TRUE(speculative.spec().speculative_update());  // as GetJob and `megatrain status` see it
    const nlohmann::json normal_result = Result(normal.spec());
    const nlohmann::json result = Result(speculative.spec());
    ASSERT_TRUE(normal_result.is_object() && result.is_object());
    EXPECT_FALSE(normal_result.contains("speculative_update")) << normal_result.dump();
    ASSERT_TRUE(result.contains("speculative_update")) << result.dump();
    // grad_clip 0: the step's clip coefficient is exactly 1, so every speculation commits.
    EXPECT_EQ(result["speculative_update"]["committed_steps"].get<uint64_t>(), 4u) << result.dump();
    EXPECT_EQ(result["speculative_update"]["discarded_steps"].get<uint64_t>(), 0u) << result.dump();
    // Bitwise: a committed speculation is the normal update.
    EXPECT_EQ(result["final_train_loss"].get<double>(),
              normal_result["final_train_loss"].get<double>());
    EXPECT_EQ(result["final_validation_loss"].get<double>(),
              normal_result["final_validation_loss"].get<double>());
  }

  TestDaemon daemon_{"speculative_job"};
  std::unique_ptr<DeviceJobEngine> engine_;
  std::string nvme_dir_;
  std::string tokens_;
};

TEST_F(SpeculativeJobTest, AJobWithItTrainsCommitsEveryStepAndReportsIt) {
  if (absl::Status usable = engine::tiers::CheckDirectIoDirectory(nvme_dir_); !usable.ok()) {
    GTEST_SKIP() << "no block-backed O_DIRECT directory under TEST_TMPDIR: " << usable;
  }
  ExpectItTrainsCommitsEveryStepAndReportsIt([this](bool s) { return MasterOnNvmeSpec(s); },
                                             "alternate master/m/v regions");
}

// The master in RAM, m and v on NVMe: an alternate master array and alternate m/v regions.
TEST_F(SpeculativeJobTest, AJobWithTheMasterInRamAndStatesOnNvmeTrainsCommitsAndReportsIt) {
  if (absl::Status usable = engine::tiers::CheckDirectIoDirectory(nvme_dir_); !usable.ok()) {
    GTEST_SKIP() << "no block-backed O_DIRECT directory under TEST_TMPDIR: " << usable;
  }
  ExpectItTrainsCommitsEveryStepAndReportsIt([this](bool s) { return StatesOnNvmeSpec(s); },
                                             "alternate m/v regions");
}

// No memory section: the master, m and v in RAM, the alternates beside them.
TEST_F(SpeculativeJobTest, AJobWithTheStateInRamTrainsCommitsEveryStepAndReportsIt) {
  ExpectItTrainsCommitsEveryStepAndReportsIt([this](bool s) { return InRamSpec(s); },
                                             "alternate master/m/v arrays");
}

TEST_F(SpeculativeJobTest, AJobWhosePlacementCannotUseItIsRefusedNamingTheField) {
  // The master, m and v in RAM, but a RAM budget that holds them once, not twice.
  v1::JobSpec in_ram = InRamSpec(false);
  grpc::ClientContext plan_context;
  v1::PlanResponse plan;
  ASSERT_TRUE(daemon_.stub().Plan(&plan_context, in_ram, &plan).ok());
  in_ram.mutable_memory()->set_ram_bytes(8 * plan.parameters() + 4096);  // m and v
  in_ram.set_speculative_update(true);
  v1::Job job;
  grpc::Status refused = TrySubmit(daemon_, in_ram, &job);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("speculative_update: true"));
  EXPECT_THAT(refused.error_message(), HasSubstr("memory.ram_bytes"));

  if (absl::Status usable = engine::tiers::CheckDirectIoDirectory(nvme_dir_); !usable.ok()) {
    GTEST_SKIP() << "no block-backed O_DIRECT directory under TEST_TMPDIR: " << usable;
  }
  // The placement is right but the NVMe budget holds one copy of master, m and v, not two.
  v1::JobSpec tight = MasterOnNvmeSpec(false);
  grpc::ClientContext nvme_plan_context;
  ASSERT_TRUE(daemon_.stub().Plan(&nvme_plan_context, tight, &plan).ok());
  uint64_t nvme_used = 0;
  for (const v1::TierUsage& t : plan.tiers()) {
    if (t.tier() == "nvme") nvme_used = t.bytes();
  }
  ASSERT_GT(nvme_used, 0u) << plan.DebugString();
  tight.mutable_memory()->set_nvme_bytes(nvme_used);
  tight.set_speculative_update(true);
  refused = TrySubmit(daemon_, tight, &job);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("speculative_update"));
  EXPECT_THAT(refused.error_message(), HasSubstr("memory.nvme_bytes"));
}

}  // namespace
}  // namespace megatrain::server::testing
