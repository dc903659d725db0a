// The daemon's Plan (run in-process, as `megatrain plan --offline` does) reports the exact NVMe
// bytes per step and per run, and warns about drive wear only when the daemon config's
// nvme_rated_tbw_bytes is set and the run writes more than nvme_wear_warn_share of it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "engine/tiers/test_dir.h"
#include "engine/train/training_run.h"
#include "service/offline_plan.h"

namespace megatrain {
namespace {

std::string WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

class DaemonPlanNvmeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::Status usable;
    root_ = engine::tiers::FreshTestDir("daemon_plan_nvme", &usable);
    if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
    std::filesystem::create_directories(root_ + "/nvme");
    corpus_ = WriteFile(root_ + "/corpus.txt", std::string(4096, 'a'));
  }

  std::string Config(const std::string& extra) {
    return WriteFile(
        root_ + "/daemon.textproto",
        absl::StrCat("config_version: 1\ndata_roots: \"", root_, "\"\noutput_roots: \"", root_,
                     "\"\ndevice_arena_bytes: 268435456\n", extra));
  }

  v1::JobSpec Spec(uint64_t steps) {
    v1::JobSpec spec;
    spec.set_name("wear");
    spec.mutable_model()->set_config_json_path("builtin:tiny");
    spec.mutable_data()->add_text_files(corpus_);
    spec.mutable_hyper()->set_steps(steps);
    spec.mutable_hyper()->set_batch_size(4);
    spec.mutable_hyper()->set_micro_batch_size(2);  // 2 micro-batches per step
    spec.mutable_hyper()->set_seq_len(32);
    spec.mutable_hyper()->mutable_lr()->set_peak_lr(1e-3);
    v1::MemoryBudgets* m = spec.mutable_memory();
    m->set_ram_bytes(uint64_t{1} << 30);
    m->set_nvme_dir(root_ + "/nvme");
    m->set_nvme_bytes(uint64_t{1} << 30);
    m->set_states_on_nvme(true);
    m->set_grad_on_nvme(true);
    return spec;
  }

  std::string root_, corpus_;
};

TEST_F(DaemonPlanNvmeTest, BytesPerStepAndTheWearWarning) {
  absl::StatusOr<v1::PlanResponse> plan = service::PlanOffline(Spec(1000), Config(""));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const engine::ModelConfig tiny = engine::TinyTextModelConfig();
  const uint64_t p = plan->parameters();
  const uint64_t grad = 4 * (p - tiny.vocab_size * tiny.hidden_size);  // but the embedding's
  // m, v read and written once; the gradients written twice, read back once and read once.
  EXPECT_EQ(plan->nvme_written_bytes_per_step(), 8 * p + 2 * grad);
  EXPECT_EQ(plan->nvme_read_bytes_per_step(), 8 * p + 2 * grad);
  EXPECT_EQ(plan->nvme_written_bytes_per_run(), 1000 * plan->nvme_written_bytes_per_step());
  EXPECT_EQ(plan->warnings_size(), 0);  // off by default

  // A drive rated for 20 runs at 10%: no warning; for fewer, a warning naming the run.
  const uint64_t run = plan->nvme_written_bytes_per_run();
  plan = service::PlanOffline(Spec(1000),
                              Config(absl::StrCat("nvme_rated_tbw_bytes: ", 10 * run, "\n")));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->warnings_size(), 0);
  plan = service::PlanOffline(Spec(1001),
                              Config(absl::StrCat("nvme_rated_tbw_bytes: ", 10 * run, "\n")));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->warnings_size(), 1);
  EXPECT_NE(plan->warnings(0).find("WARNING drive wear"), std::string::npos);
  EXPECT_NE(plan->warnings(0).find("1001 steps"), std::string::npos) << plan->warnings(0);

  // A share without the rated TBW is refused naming the field.
  plan = service::PlanOffline(Spec(10), Config("nvme_wear_warn_share: 0.5\n"));
  EXPECT_NE(plan.status().message().find("nvme_wear_warn_share"), std::string::npos)
      << plan.status();
}

// On a GPU the daemon plans the bf16 compute copy at 2 bytes per parameter (it planned 4, the
// CPU device's fp32, and so over-reserved RAM and could refuse jobs that fit).
TEST_F(DaemonPlanNvmeTest, ACudaDaemonPlansABf16ComputeCopy) {
  absl::StatusOr<v1::PlanResponse> plan =
      service::PlanOffline(Spec(10), Config("device: \"cuda\"\n"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  uint64_t master = 0, copy = 0;
  for (const v1::BufferPlacement& b : plan->placements()) {
    if (b.kind() == "master") master = b.bytes();
    if (b.kind() == "compute_copy") copy = b.bytes();
  }
  ASSERT_GT(master, 0u);
  EXPECT_EQ(2 * copy, master);
}

}  // namespace
}  // namespace megatrain
