// The job spec's proto3 `optional` fields: absent means the documented default, a set value is
// used as given, 0 included (validation_fraction 0 = no validation set, adam_beta1 0 = no
// momentum); out-of-range values are still refused naming the field.
#include "service/job_spec_validation.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "engine/tiers/direct_io_directory.h"
#include "engine/tiers/nvme_tier_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/daemon_config.h"
#include "service/path_policy.h"

namespace megatrain::service {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class JobSpecValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::getenv("TEST_TMPDIR");
    std::ofstream(root_ + "/corpus.txt") << std::string(4096, 'x') << "\n";
    v1::DaemonConfig config;  // the documented defaults, with the temp dir as the roots
    config.set_config_version(kDaemonConfigVersion);
    config.set_state_dir(root_ + "/state");
    config.set_socket_path("/nonexistent/megatraind.sock");  // never listened on
    config.add_data_roots(root_);
    config.add_output_roots(root_);
    absl::StatusOr<DaemonSettings> settings = ValidateDaemonConfig(config);
    ASSERT_TRUE(settings.ok()) << settings.status();
    settings_ = *std::move(settings);
  }

  v1::JobSpec Spec() const {
    v1::JobSpec spec;
    spec.mutable_model()->set_config_json_path(kBuiltinTinyModel);
    spec.mutable_data()->add_text_files(root_ + "/corpus.txt");
    spec.mutable_hyper()->set_steps(3);
    spec.mutable_hyper()->set_seq_len(16);
    spec.mutable_hyper()->set_batch_size(2);
    return spec;
  }

  absl::StatusOr<ValidatedJob> Validate(const v1::JobSpec& spec) const {
    return ValidateJobSpec(spec, settings_, PathPolicy({root_}, {root_}));
  }

  std::string root_;
  DaemonSettings settings_;
};

TEST_F(JobSpecValidationTest, AbsentOptionalFieldsTakeTheDocumentedDefaults) {
  absl::StatusOr<ValidatedJob> job = Validate(Spec());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->options.validation_fraction, kDefaultValidationFraction);
  EXPECT_EQ(job->options.trainer.beta1, kDefaultAdamBeta1);
  EXPECT_EQ(job->options.trainer.beta2, kDefaultAdamBeta2);
  EXPECT_EQ(job->options.trainer.eps, kDefaultAdamEps);
}

TEST_F(JobSpecValidationTest, AZeroThatIsSetIsUsedAsGiven) {
  v1::JobSpec spec = Spec();
  spec.mutable_data()->set_validation_fraction(0);
  spec.mutable_hyper()->set_adam_beta1(0);
  spec.mutable_hyper()->set_adam_beta2(0.5);
  spec.mutable_hyper()->set_adam_eps(1e-6);
  absl::StatusOr<ValidatedJob> job = Validate(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->options.validation_fraction, 0.0);
  EXPECT_EQ(job->options.trainer.beta1, 0.0);
  EXPECT_EQ(job->options.trainer.beta2, 0.5);
  EXPECT_EQ(job->options.trainer.eps, 1e-6);
}

TEST_F(JobSpecValidationTest, ASetEpsOfZeroIsRefusedNotReplaced) {
  v1::JobSpec spec = Spec();
  spec.mutable_hyper()->set_adam_eps(0);
  absl::StatusOr<ValidatedJob> job = Validate(spec);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(), HasSubstr("hyper.adam_eps"));
}

// executor.head_block_rows reaches the trainer and the plan: smaller blocks of the 256-row
// byte vocabulary shrink the head's device scratch; past the cap it is refused by name.
TEST_F(JobSpecValidationTest, HeadBlockRowsReachesTheTrainerAndThePlan) {
  absl::StatusOr<ValidatedJob> whole = Validate(Spec());
  ASSERT_TRUE(whole.ok()) << whole.status();
  v1::JobSpec spec = Spec();
  spec.mutable_executor()->set_head_block_rows(17);
  absl::StatusOr<ValidatedJob> blocked = Validate(spec);
  ASSERT_TRUE(blocked.ok()) << blocked.status();
  EXPECT_EQ(blocked->options.trainer.head_block_rows, 17);
  EXPECT_LT(blocked->plan.device_arena_peak_bytes(), whole->plan.device_arena_peak_bytes());
  EXPECT_NE(engine::TrainingJobJson(blocked->options),
            engine::TrainingJobJson(whole->options));

  spec.mutable_executor()->set_head_block_rows((1u << 20) + 1);
  absl::StatusOr<ValidatedJob> huge = Validate(spec);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(huge.status().message(), HasSubstr("executor.head_block_rows"));
}

// executor.gradient_accumulation and executor.gradient_reduction reach the trainer (auto when
// unset, as train_local's flags); anything else is refused naming the field and the value.
TEST_F(JobSpecValidationTest, GradientAccumulationAndReductionReachTheTrainer) {
  absl::StatusOr<ValidatedJob> unset = Validate(Spec());
  ASSERT_TRUE(unset.ok()) << unset.status();
  EXPECT_EQ(unset->options.trainer.executor.gradient_accumulation,
            engine::GradientAccumulation::kAuto);
  EXPECT_EQ(unset->options.trainer.gradient_reduction, engine::GradientReduction::kAuto);
  v1::JobSpec spec = Spec();
  spec.mutable_executor()->set_gradient_accumulation("device");
  spec.mutable_executor()->set_gradient_reduction("host");
  absl::StatusOr<ValidatedJob> set = Validate(spec);
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->options.trainer.executor.gradient_accumulation,
            engine::GradientAccumulation::kDevice);
  EXPECT_EQ(set->options.trainer.gradient_reduction, engine::GradientReduction::kHost);

  spec.mutable_executor()->set_gradient_accumulation("gpu");
  absl::StatusOr<ValidatedJob> bad_sum = Validate(spec);
  ASSERT_FALSE(bad_sum.ok());
  EXPECT_EQ(bad_sum.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_sum.status().message(), HasSubstr("executor.gradient_accumulation"));
  EXPECT_THAT(bad_sum.status().message(), HasSubstr("'gpu'"));
  spec.mutable_executor()->set_gradient_accumulation("");
  spec.mutable_executor()->set_gradient_reduction("nccl");
  absl::StatusOr<ValidatedJob> bad_reduction = Validate(spec);
  ASSERT_FALSE(bad_reduction.ok());
  EXPECT_THAT(bad_reduction.status().message(), HasSubstr("executor.gradient_reduction"));
  EXPECT_THAT(bad_reduction.status().message(), HasSubstr("'nccl'"));
}

// JobSpec.devices: 0 and 1 mean one device; more than the daemon drives is refused by name.
TEST_F(JobSpecValidationTest, DevicesAboveTheDaemonsAreRefusedNamingTheField) {
  v1::JobSpec spec = Spec();
  for (uint32_t devices : {0u, 1u}) {
    spec.set_devices(devices);
    absl::StatusOr<ValidatedJob> job = Validate(spec);
    ASSERT_TRUE(job.ok()) << devices << ": " << job.status();
    EXPECT_EQ(job->plan.devices(), 1u);
  }
  EXPECT_EQ(settings_.devices, 1u);
  spec.set_devices(2);
  absl::StatusOr<ValidatedJob> two = Validate(spec);
  ASSERT_FALSE(two.ok());
  EXPECT_EQ(two.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(two.status().message(), HasSubstr("devices: 2 is more than the 1 device(s)"));
  settings_.devices = 4;
  spec.set_devices(4);
  absl::StatusOr<ValidatedJob> four = Validate(spec);
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_EQ(four->plan.devices(), 4u);
  // Each device runs the spec's batch: the run's accumulation is devices x the spec's.
  spec.set_devices(1);
  absl::StatusOr<ValidatedJob> one = Validate(spec);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->options.devices, 1);
  EXPECT_EQ(four->options.devices, 4);
  EXPECT_EQ(four->options.grad_accumulation, 4 * one->options.grad_accumulation);
}

// speculative_update: with the master, m and v in RAM it reaches the trainer and the plan counts
// the alternate arrays; a RAM budget without room for them is refused naming memory.ram_bytes;
// m and v on NVMe beside a master in RAM (the mixed form) is accepted, and refused naming
// memory.nvme_bytes without NVMe room for their alternate regions; all three on NVMe is accepted
// (the NVMe part needs O_DIRECT scratch).
TEST_F(JobSpecValidationTest, SpeculativeUpdateNeedsAPlacementWithRoomForItsSecondCopy) {
  v1::JobSpec spec = Spec();
  spec.set_speculative_update(true);
  absl::StatusOr<ValidatedJob> in_ram = Validate(spec);
  ASSERT_TRUE(in_ram.ok()) << in_ram.status();
  EXPECT_TRUE(in_ram->options.trainer.speculative_update);
  EXPECT_THAT(in_ram->plan.speculative_update(),
              HasSubstr("speculative update on: alternate master/m/v arrays"));
  absl::StatusOr<ValidatedJob> off = Validate(Spec());
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->options.trainer.speculative_update);
  EXPECT_TRUE(off->plan.speculative_update().empty());

  // RAM for m and v once (the master and gradients are pinned), not twice.
  v1::JobSpec tight = spec;
  tight.mutable_memory()->set_ram_bytes(8 * in_ram->plan.parameters() + 4096);
  absl::StatusOr<ValidatedJob> no_room = Validate(tight);
  ASSERT_FALSE(no_room.ok());
  EXPECT_EQ(no_room.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(no_room.status().message(), HasSubstr("speculative_update: true"));
  EXPECT_THAT(no_room.status().message(), HasSubstr("more of RAM"));
  EXPECT_THAT(no_room.status().message(), HasSubstr("memory.ram_bytes"));

  const std::string nvme = root_ + "/nvme";
  std::filesystem::create_directories(nvme);
  if (absl::Status usable = engine::tiers::CheckDirectIoDirectory(nvme); !usable.ok()) {
    GTEST_SKIP() << "no block-backed O_DIRECT directory under TEST_TMPDIR: " << usable;
  }
  spec.mutable_memory()->set_nvme_dir(nvme);
  spec.mutable_memory()->set_nvme_bytes(uint64_t{1} << 30);
  spec.mutable_memory()->set_states_on_nvme(true);
  absl::StatusOr<ValidatedJob> mixed = Validate(spec);
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_TRUE(mixed->options.trainer.speculative_update);
  EXPECT_THAT(mixed->plan.speculative_update(),
              HasSubstr("speculative update on: alternate m/v regions"));
  EXPECT_THAT(mixed->plan.speculative_update(), HasSubstr("on NVMe and master array"));
  // The mixed form with NVMe for m and v once: refused naming memory.nvme_bytes.
  v1::JobSpec mixed_tight = spec;
  mixed_tight.mutable_memory()->set_nvme_bytes(8 * in_ram->plan.parameters() + 4096);
  absl::StatusOr<ValidatedJob> mixed_no_room = Validate(mixed_tight);
  ASSERT_FALSE(mixed_no_room.ok());
  EXPECT_EQ(mixed_no_room.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(mixed_no_room.status().message(), HasSubstr("more of NVMe"));
  EXPECT_THAT(mixed_no_room.status().message(), HasSubstr("memory.nvme_bytes"));
  spec.mutable_memory()->set_master_on_nvme(true);
  absl::StatusOr<ValidatedJob> job = Validate(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(job->options.trainer.speculative_update);
  EXPECT_THAT(job->plan.speculative_update(), HasSubstr("speculative update on"));
}

// hyper.grad_clip_rule and hyper.grad_clip_headroom reach the trainer; a rule without a clip, an
// unknown rule and a headroom without the rule or below 1 are refused naming the field.
TEST_F(JobSpecValidationTest, ClipRuleReachesTheTrainerOrIsRefusedByField) {
  absl::StatusOr<ValidatedJob> plain = Validate(Spec());
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->options.trainer.grad_clip_rule, engine::GradClipRule::kExact);
  v1::JobSpec spec = Spec();
  spec.mutable_hyper()->set_grad_clip(1.0);
  spec.mutable_hyper()->set_grad_clip_rule("previous_norm");
  absl::StatusOr<ValidatedJob> job = Validate(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->options.trainer.grad_clip_rule, engine::GradClipRule::kPreviousNorm);
  EXPECT_EQ(job->options.trainer.grad_clip_headroom, engine::kDefaultGradClipHeadroom);
  spec.mutable_hyper()->set_grad_clip_headroom(2.0);
  job = Validate(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->options.trainer.grad_clip_headroom, 2.0);

  const auto refused = [&](const v1::JobSpec& bad, const std::string& text) {
    const absl::StatusOr<ValidatedJob> r = Validate(bad);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr(text));
  };
  v1::JobSpec bad = spec;
  bad.mutable_hyper()->set_grad_clip_headroom(0.5);
  refused(bad, "hyper.grad_clip_headroom");
  bad = spec;
  bad.mutable_hyper()->set_grad_clip_rule("stale");
  refused(bad, "hyper.grad_clip_rule: 'stale' is not a clip rule");
  bad = spec;
  bad.mutable_hyper()->set_grad_clip(0);
  refused(bad, "hyper.grad_clip_rule: previous_norm needs a clip");
  bad = Spec();
  bad.mutable_hyper()->set_grad_clip_headroom(2.0);
  refused(bad, "hyper.grad_clip_headroom: set without hyper.grad_clip_rule previous_norm");
}

// A job's ranks on one machine share its NVMe directory's filesystem and drive: the free space
// must hold every rank's nvme_bytes, and the drive wear counts every rank's writes.
TEST_F(JobSpecValidationTest, RanksOfOneMachineShareItsNvme) {
  const std::string nvme = root_ + "/nvme_ranks";
  std::filesystem::create_directories(nvme);
  if (absl::Status usable = engine::tiers::CheckDirectIoDirectory(nvme); !usable.ok()) {
    GTEST_SKIP() << "no block-backed O_DIRECT directory under TEST_TMPDIR: " << usable;
  }
  const uint64_t free_bytes = std::filesystem::space(nvme).available;
  v1::JobSpec spec = Spec();
  spec.mutable_memory()->set_nvme_dir(nvme);
  spec.mutable_memory()->set_nvme_bytes(free_bytes / 2);
  spec.mutable_memory()->set_states_on_nvme(true);
  spec.add_hosts("localhost:1");
  absl::StatusOr<ValidatedJob> one = Validate(spec);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->plan.ranks_per_machine(), 1u);
  const uint64_t per_run = one->plan.nvme_written_bytes_per_run();
  ASSERT_GT(per_run, 0u);

  spec.clear_hosts();
  spec.add_hosts("localhost:3");
  absl::StatusOr<ValidatedJob> three = Validate(spec);
  ASSERT_FALSE(three.ok());
  EXPECT_EQ(three.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(three.status().message(), HasSubstr("memory.nvme_bytes: "));
  EXPECT_THAT(three.status().message(), HasSubstr("per rank, for the 3 ranks of one machine,"));
  // A host named twice runs both counts: 1 + 2 ranks on localhost are three on one machine.
  spec.clear_hosts();
  spec.add_hosts("localhost:1");
  spec.add_hosts("localhost:2");
  absl::StatusOr<ValidatedJob> named_twice = Validate(spec);
  ASSERT_FALSE(named_twice.ok());
  EXPECT_THAT(named_twice.status().message(),
              HasSubstr("per rank, for the 3 ranks of one machine,"));
  spec.clear_hosts();
  spec.add_hosts("localhost:3");

  // Room for three: the plan says so, and a drive rated for 20 runs of one rank (a warning above
  // two at the 10% share) warns for three ranks, not for one.
  spec.mutable_memory()->set_nvme_bytes(free_bytes / 10);
  settings_.drive_wear.rated_tbw_bytes = 20 * per_run;
  three = Validate(spec);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->plan.ranks_per_machine(), 3u);
  EXPECT_EQ(three->plan.nvme_written_bytes_per_run(), per_run) << "one rank's";
  ASSERT_EQ(three->plan.warnings_size(), 1);
  EXPECT_THAT(three->plan.warnings(0), HasSubstr("(3 ranks x 3 steps x "));
  spec.clear_hosts();
  spec.add_hosts("localhost:1");
  one = Validate(spec);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->plan.warnings_size(), 0);

  // A rank re-validating on its machine (ranks_on_this_machine set) checks its own share of the
  // free space only: its neighbours may have reserved theirs already.
  spec.clear_hosts();
  spec.add_hosts("localhost:3");
  spec.mutable_memory()->set_nvme_bytes(free_bytes / 2);
  settings_.ranks_on_this_machine = 3;
  absl::StatusOr<ValidatedJob> rank = Validate(spec);
  ASSERT_TRUE(rank.ok()) << rank.status();
  EXPECT_EQ(rank->plan.ranks_per_machine(), 3u);
}

// A previous run's tier files in the job's own tier directory hold space the job frees when its
// stores replace them: resuming a job (or rerunning one) whose state files fill the disk must
// not be refused for lack of the space they hold. Files anywhere else count as used.
TEST_F(JobSpecValidationTest, APreviousRunsTierFilesCountAsFree) {
  const std::string nvme = root_ + "/nvme_previous";
  std::filesystem::remove_all(nvme);
  std::filesystem::create_directories(nvme + "/rank-1");
  if (absl::Status usable = engine::tiers::CheckDirectIoDirectory(nvme); !usable.ok()) {
    GTEST_SKIP() << "no block-backed O_DIRECT directory under TEST_TMPDIR: " << usable;
  }
  // 1 GiB each: the checks below keep a 512 MiB margin against other tests' disk use.
  constexpr off_t kHeld = off_t{1} << 30;
  auto hold = [&](const std::string& path) {
    const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0) << path;
    ASSERT_EQ(::posix_fallocate(fd, 0, kHeld), 0) << path;
    ::close(fd);
  };
  hold(absl::StrCat(nvme, "/", engine::tiers::kOptimizerStateFileName));
  hold(absl::StrCat(nvme, "/rank-1/", engine::tiers::kGradientFileName));
  const uint64_t free_bytes = std::filesystem::space(nvme).available;
  v1::JobSpec spec = Spec();
  spec.mutable_memory()->set_nvme_dir(nvme);
  spec.mutable_memory()->set_nvme_bytes(free_bytes + kHeld / 2);
  spec.mutable_memory()->set_states_on_nvme(true);

  // One process: its stores go to nvme_dir itself, where the previous state file is.
  absl::StatusOr<ValidatedJob> one = Validate(spec);
  ASSERT_TRUE(one.ok()) << one.status();

  // Two ranks on this machine: the daemon counts the job's rank directories (rank-1's file),
  // and two shares of free + 1 GiB fit where two of free alone would not.
  spec.add_hosts("localhost:2");
  spec.mutable_memory()->set_nvme_bytes((free_bytes + kHeld) / 2 - kHeld / 4);
  absl::StatusOr<ValidatedJob> daemon = Validate(spec);
  ASSERT_TRUE(daemon.ok()) << "rank-1's file is the job's: " << daemon.status();

  // Four ranks, two here: whichever two mpirun puts here, they free at least the two smallest
  // rank directories' bytes. rank-2's and rank-3's files may be on the other machine's ranks.
  std::filesystem::create_directories(nvme + "/rank-3");
  hold(absl::StrCat(nvme, "/rank-3/", engine::tiers::kComputeCopyFileName));
  std::filesystem::rename(absl::StrCat(nvme, "/rank-1"), absl::StrCat(nvme, "/rank-2"));
  settings_.allowed_hosts = {"node2"};
  spec.clear_hosts();
  spec.add_hosts("localhost:2");
  spec.add_hosts("node2:2");
  absl::StatusOr<ValidatedJob> elsewhere = Validate(spec);
  ASSERT_FALSE(elsewhere.ok()) << "rank-2's and rank-3's files need not be on this machine";
  EXPECT_THAT(elsewhere.status().message(), HasSubstr("for the 2 ranks of one machine"));
  std::filesystem::rename(absl::StrCat(nvme, "/rank-2"), absl::StrCat(nvme, "/rank-1"));
  std::filesystem::remove_all(absl::StrCat(nvme, "/rank-3"));
  spec.clear_hosts();
  spec.add_hosts("localhost:2");

  // A rank counts its own directory only: rank 1's previous file is its own, not rank 0's.
  settings_.ranks_on_this_machine = 2;
  settings_.rank = 1;
  spec.mutable_memory()->set_nvme_bytes(free_bytes + kHeld / 2);
  absl::StatusOr<ValidatedJob> rank1 = Validate(spec);
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  settings_.rank = 0;
  absl::StatusOr<ValidatedJob> rank0 = Validate(spec);
  ASSERT_FALSE(rank0.ok());
  EXPECT_THAT(rank0.status().message(), HasSubstr("memory.nvme_bytes: "));
  EXPECT_THAT(rank0.status().message(), Not(HasSubstr("previous run")));
  std::filesystem::remove_all(nvme);
}

}  // namespace
}  // namespace megatrain::service
