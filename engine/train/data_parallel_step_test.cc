// The data-parallel step's helpers in a world of one and its slot arithmetic (the multi-rank
// behaviour is tested under mpirun in tests/dist).
#include "engine/train/data_parallel_step.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/device/cpu_device.h"
#include "engine/optimizer/grad_norm.h"
#include "engine/tiers/test_dir.h"
#include "engine/train/trainer.h"

namespace megatrain::engine {
namespace {

// A CPU device with a 1 MiB arena and `pinned` bytes of pinned budget, for stores.
absl::StatusOr<std::unique_ptr<CpuDevice>> SmallCpuDevice(size_t pinned) {
  DeviceOptions options;
  options.kind = DeviceKind::kCpu;
  options.arena_bytes = size_t{1} << 20;
  options.pinned_budget_bytes = pinned;
  return CpuDevice::Create(options);
}

TEST(RankSlotsTest, ContiguousSlotsPerRank) {
  EXPECT_EQ(RankSlotsOf(6, 0, 3)->first, 0);
  EXPECT_EQ(RankSlotsOf(6, 2, 3)->first, 4);
  EXPECT_EQ(RankSlotsOf(6, 2, 3)->count, 2);
  EXPECT_EQ(RankSlotsOf(2, 1, 2)->first, 1);
  EXPECT_EQ(RankSlotsOf(2, 1, 2)->count, 1);
  const absl::StatusOr<RankSlots> odd = RankSlotsOf(3, 0, 2);
  ASSERT_FALSE(odd.ok());
  EXPECT_EQ(odd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(odd.status().message().find("grad_accumulation=3"), std::string::npos);
  EXPECT_FALSE(RankSlotsOf(0, 0, 1).ok());
}

TEST(RankFirstDeviceTest, TheMachinesRanksSplitItsDevicesInLocalRankOrder) {
  // 8 GPUs, 4 ranks of 2 devices: 0-1, 2-3, 4-5, 6-7.
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(*RankFirstDevice({.local_rank = r, .local_size = 4, .devices_per_rank = 2,
                                .visible = 8}),
              2 * r);
  }
  // One rank per machine driving 4 of its 8.
  EXPECT_EQ(*RankFirstDevice({.local_rank = 0, .local_size = 1, .devices_per_rank = 4,
                              .visible = 8}),
            0);
  // The launcher gave each rank its own two (CUDA_VISIBLE_DEVICES per rank): every rank at 0.
  EXPECT_EQ(*RankFirstDevice({.local_rank = 3, .local_size = 4, .devices_per_rank = 2,
                              .visible = 2, .launcher_restricted = true}),
            0);
}

TEST(RankFirstDeviceTest, TwoRanksOnOneGpuAreRefusedNamingTheNumbers) {
  // 2 visible, 2 ranks of 2, every rank seeing the same GPUs: both would take 0-1.
  const absl::StatusOr<int> shared = RankFirstDevice(
      {.local_rank = 1, .local_size = 2, .devices_per_rank = 2, .visible = 2});
  ASSERT_FALSE(shared.ok());
  EXPECT_EQ(shared.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(shared.status().message().find("devices=2 per rank with 2 ranks on this machine "
                                           "needs 4 GPUs, but local rank 1 sees 2"),
            std::string::npos)
      << shared.status();
  // Restricted but too few for even one rank.
  const absl::StatusOr<int> short_set = RankFirstDevice({.local_rank = 0, .local_size = 2,
                                                         .devices_per_rank = 2, .visible = 1,
                                                         .launcher_restricted = true});
  ASSERT_FALSE(short_set.ok());
  EXPECT_NE(short_set.status().message().find("(CUDA_VISIBLE_DEVICES is set)"), std::string::npos)
      << short_set.status();
  // Restricted with more than its share (3 of its own for 2): starts at 0, to be verified by
  // CheckDistinctGpus.
  EXPECT_EQ(*RankFirstDevice({.local_rank = 1, .local_size = 2, .devices_per_rank = 2,
                              .visible = 3, .launcher_restricted = true}),
            0);
  EXPECT_FALSE(RankFirstDevice({.local_rank = 2, .local_size = 2}).ok());
  EXPECT_FALSE(RankFirstDevice({.devices_per_rank = 0, .visible = 1}).ok());
}

// In a world of one the fingerprints still catch one GPU listed twice (the multi-rank gathers
// are AllGatherDoubles', tested under mpirun).
TEST(CheckDistinctGpusTest, OneGpuTwiceIsRefused) {
  dist::SingleProcessCommunicator one;
  EXPECT_TRUE(CheckDistinctGpus(one, {"GPU-a", "GPU-b"}).ok());
  EXPECT_TRUE(CheckDistinctGpus(one, {}).ok());
  const absl::Status twice = CheckDistinctGpus(one, {"GPU-a", "GPU-b", "GPU-a"});
  EXPECT_EQ(twice.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(twice.message().find("rank 0 drives one GPU twice (GPU-a)"), std::string::npos)
      << twice;
}

TEST(DataParallelStepTest, WorldOfOneKeepsCountsAndLossSums) {
  dist::SingleProcessCommunicator one;
  EXPECT_EQ(*GlobalValidTargets(one, 1234), 1234);
  const double loss = 0.1 + 0.2;
  EXPECT_EQ(*GlobalLossSum(one, loss), loss);
  EXPECT_EQ(*GlobalLossSum(one, -0.0), 0.0);
  EXPECT_TRUE(CheckSameJob(one, "{\"steps\": 4} from step 1").ok());
}

TEST(AllRanksOkTest, WorldOfOneReturnsItsOwnStatusWithItsRank) {
  dist::SingleProcessCommunicator one;
  EXPECT_TRUE(AllRanksOk(one, absl::OkStatus()).ok());
  const absl::Status failed = AllRanksOk(one, absl::DataLossError("disk full"));
  EXPECT_EQ(failed.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(failed.message(), "rank 0: disk full");
}

// A world of one owns every element, and its gathered sums are GradSumOfSquares' bits.
TEST(Zero1SumsTest, WorldOfOneGivesOneProcessBits) {
  dist::SingleProcessCommunicator one;
  absl::StatusOr<std::unique_ptr<CpuDevice>> device = SmallCpuDevice(size_t{4} << 20);
  ASSERT_TRUE(device.ok()) << device.status();
  std::vector<EntrySpec> specs(2);
  specs[0].elements = 3 * kGradNormChunkElements + 17;
  specs[1].elements = 5;
  absl::StatusOr<ParameterStore> store = ParameterStore::Create(**device, specs, {});
  ASSERT_TRUE(store.ok()) << store.status();
  for (int e = 0; e < 2; ++e) {
    float* g = store->entry(e).grad;
    for (size_t i = 0; i < specs[e].elements; ++i)
      g[i] = 0.001f * static_cast<float>(i % 977) - 0.3f;
  }
  const Zero1Shards shards(
      EntryChunks({specs[0].elements, specs[1].elements}, kGradNormChunkElements), 1);
  absl::StatusOr<std::vector<double>> sums = OwnedGradSumsOfSquares(one, *store, shards, nullptr);
  ASSERT_TRUE(sums.ok()) << sums.status();
  for (int e = 0; e < 2; ++e) EXPECT_EQ((*sums)[e], store->GradSumOfSquares(e, nullptr)) << e;
}

TEST(Zero1StoreTest, OptimizerStateOnlyForOwnedEntries) {
  absl::StatusOr<std::unique_ptr<CpuDevice>> device = SmallCpuDevice(size_t{1} << 20);
  ASSERT_TRUE(device.ok()) << device.status();
  std::vector<EntrySpec> specs(2);
  specs[0].elements = 1000;
  specs[1].elements = 3000;
  StorePlacement all;
  absl::StatusOr<ParameterStore> full = ParameterStore::Create(**device, specs, all);
  ASSERT_TRUE(full.ok()) << full.status();
  StorePlacement sharded;
  sharded.optimizer_state_ranges = {{0, 1000}, {0, 0}};
  absl::StatusOr<ParameterStore> shard = ParameterStore::Create(**device, specs, sharded);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_NE(shard->entry(0).m, nullptr);
  EXPECT_NE(shard->entry(0).v, nullptr);
  EXPECT_EQ(shard->entry(1).m, nullptr);
  EXPECT_EQ(shard->entry(1).v, nullptr);
  EXPECT_NE(shard->entry(1).master, nullptr);  // the weights every rank streams stay whole
  EXPECT_TRUE(shard->has_optimizer_state(0));
  EXPECT_FALSE(shard->has_optimizer_state(1));
  // m and v are pageable: the shard holds 2 x 3000 floats fewer.
  EXPECT_EQ(full->pageable_ram_bytes() - shard->pageable_ram_bytes(), 2 * 3000 * sizeof(float));
  std::vector<float> m(3000), v(3000);
  const absl::Status refused = shard->ReadOptimizerState(1, m.data(), v.data());
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("entry 1"), std::string::npos);
  EXPECT_EQ(shard->WriteOptimizerState(1, m.data(), v.data()).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(shard->ReadOptimizerState(0, m.data(), v.data()).ok());

  StorePlacement wrong;
  wrong.optimizer_state_ranges = {{0, 1000}};
  const absl::StatusOr<ParameterStore> bad = ParameterStore::Create(**device, specs, wrong);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("1 ranges for 2 entries"), std::string::npos);
  // A range must be whole chunks of its entry.
  StorePlacement cut;
  cut.nvme_chunk_bytes = size_t{256} << 10;
  cut.optimizer_state_ranges = {{0, 1000}, {0, 100}};
  const absl::StatusOr<ParameterStore> not_whole = ParameterStore::Create(**device, specs, cut);
  EXPECT_EQ(not_whole.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(not_whole.status().message().find("optimizer_state_ranges[1] = [0, 100)"),
            std::string::npos)
      << not_whole.status();
}

// A rank's range of an entry several chunks long: m and v hold that range only, read and written
// through the store at their offset, in RAM and on NVMe.
TEST(Zero1StoreTest, PartOfAnEntry) {
  absl::StatusOr<std::unique_ptr<CpuDevice>> device = SmallCpuDevice(size_t{8} << 20);
  ASSERT_TRUE(device.ok()) << device.status();
  std::vector<EntrySpec> specs(1);
  specs[0].elements = 3 * 65536 + 100;  // four 64 Ki-element chunks, the last short
  StorePlacement p;
  p.nvme_chunk_bytes = size_t{256} << 10;
  p.optimizer_state_ranges = {{65536, 2 * 65536}};
  absl::StatusOr<ParameterStore> store = ParameterStore::Create(**device, specs, p);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(store->entry(0).state_first, 65536u);
  EXPECT_TRUE(store->has_optimizer_state(0));
  EXPECT_FALSE(store->has_whole_optimizer_state(0));
  StorePlacement all;
  all.nvme_chunk_bytes = p.nvme_chunk_bytes;
  absl::StatusOr<ParameterStore> full = ParameterStore::Create(**device, specs, all);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(full->pageable_ram_bytes() - store->pageable_ram_bytes(),
            2 * (65536 + 100) * sizeof(float));
  std::vector<float> m(2 * 65536), v(2 * 65536), m_back(m.size()), v_back(v.size());
  for (size_t i = 0; i < m.size(); ++i) {
    m[i] = static_cast<float>(i) * 0.5f;
    v[i] = static_cast<float>(i) + 0.25f;
  }
  ASSERT_TRUE(store->WriteOptimizerState(0, m.data(), v.data()).ok());
  EXPECT_EQ(store->entry(0).m[5], m[5]);
  ASSERT_TRUE(store->ReadOptimizerState(0, m_back.data(), v_back.data()).ok());
  EXPECT_EQ(m_back, m);
  EXPECT_EQ(v_back, v);

  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("zero1_part_on_nvme", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  p.states_on_nvme = true;
  p.nvme_dir = dir;
  absl::StatusOr<ParameterStore> on_nvme = ParameterStore::Create(**device, specs, p);
  ASSERT_TRUE(on_nvme.ok()) << on_nvme.status();
  EXPECT_EQ(on_nvme->state_store()->file_bytes(), 2 * 2 * (size_t{256} << 10))
      << "two chunks of m and v";
  ASSERT_TRUE(on_nvme->WriteOptimizerState(0, m.data(), v.data()).ok());
  std::fill(m_back.begin(), m_back.end(), 0.0f);
  ASSERT_TRUE(on_nvme->ReadOptimizerState(0, m_back.data(), v_back.data()).ok());
  EXPECT_EQ(m_back, m);
  EXPECT_EQ(v_back, v);
}

// ZeRO-1 with the optimizer state on NVMe: the rank's state file holds its own entries' m and v
// only, which round-trip through it; the others' are refused as in RAM. The masters stay in RAM
// (every rank's forward streams them): master_on_nvme is refused naming both fields.
TEST(Zero1StoreTest, StateFileOnNvmeHoldsOnlyOwnedEntries) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("zero1_states_on_nvme", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  absl::StatusOr<std::unique_ptr<CpuDevice>> device = SmallCpuDevice(size_t{4} << 20);
  ASSERT_TRUE(device.ok()) << device.status();
  std::vector<EntrySpec> specs(3);
  for (EntrySpec& s : specs) s.elements = 70000;  // two 64 Ki-element chunks, the last short
  StorePlacement p;
  p.states_on_nvme = true;
  p.nvme_chunk_bytes = size_t{256} << 10;
  p.nvme_dir = dir;
  p.optimizer_state_ranges = {{0, 0}, {0, 70000}, {0, 0}};
  absl::StatusOr<ParameterStore> store = ParameterStore::Create(**device, specs, p);
  ASSERT_TRUE(store.ok()) << store.status();
  const tiers::NvmeStateStore& file = *store->state_store();
  const uint64_t chunk_bytes = (size_t{256} << 10);
  const uint64_t tail_bytes = 20480;  // 4464 floats, rounded up to 4 KiB blocks
  EXPECT_EQ(file.file_bytes(), 2 * (chunk_bytes + tail_bytes)) << "only entry 1's m and v";
  std::vector<float> m(70000), v(70000), m_back(70000), v_back(70000);
  for (size_t i = 0; i < m.size(); ++i) {
    m[i] = static_cast<float>(i) * 0.5f;
    v[i] = static_cast<float>(i) + 0.25f;
  }
  ASSERT_TRUE(store->WriteOptimizerState(1, m.data(), v.data()).ok());
  ASSERT_TRUE(store->ReadOptimizerState(1, m_back.data(), v_back.data()).ok());
  EXPECT_EQ(m_back, m);
  EXPECT_EQ(v_back, v);
  EXPECT_EQ(store->ReadOptimizerState(0, m_back.data(), v_back.data()).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->WriteOptimizerState(2, m.data(), v.data()).code(),
            absl::StatusCode::kFailedPrecondition);
  for (int e = 0; e < 3; ++e) EXPECT_NE(store->entry(e).master, nullptr) << e;

  // The master on NVMe needs the fp32 compute copy in RAM, which holds every weight: a GPU's
  // bf16 copy, or a copy on NVMe, is refused naming the field.
  StorePlacement bf16 = p;
  bf16.master_on_nvme = true;
  bf16.compute_copy_bf16 = true;
  const absl::StatusOr<ParameterStore> refused = ParameterStore::Create(**device, specs, bf16);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("master_on_nvme needs the fp32 compute copy"),
            std::string::npos)
      << refused.status();
}

// ZeRO-1 with the master on NVMe: the state file holds master, m and v of the rank's range only;
// WriteMaster writes that range there and the whole fp32 compute copy, which ReadMaster reads
// (every weight, bit for bit the master).
TEST(Zero1StoreTest, MasterOnNvmeHoldsTheRangeAndTheCopyHoldsEverything) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("zero1_master_on_nvme", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  absl::StatusOr<std::unique_ptr<CpuDevice>> device = SmallCpuDevice(size_t{8} << 20);
  ASSERT_TRUE(device.ok()) << device.status();
  std::vector<EntrySpec> specs(2);
  specs[0].elements = 3 * 65536 + 100;  // four chunks
  specs[1].elements = 5000;
  StorePlacement p;
  p.states_on_nvme = true;
  p.master_on_nvme = true;
  p.compute_copy_fp32 = true;
  p.nvme_chunk_bytes = size_t{256} << 10;
  p.nvme_dir = dir;
  p.optimizer_state_ranges = {{65536, 2 * 65536}, {0, 0}};
  absl::StatusOr<ParameterStore> store = ParameterStore::Create(**device, specs, p);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(store->state_store()->file_bytes(), 3 * 2 * (size_t{256} << 10))
      << "master, m and v of two chunks";
  for (int e = 0; e < 2; ++e) {
    std::vector<float> master(specs[e].elements), back(specs[e].elements);
    for (size_t i = 0; i < master.size(); ++i) master[i] = 0.25f * static_cast<float>(i) + e;
    ASSERT_TRUE(store->WriteMaster(e, master.data()).ok()) << e;
    ASSERT_TRUE(store->ReadMaster(e, back.data()).ok()) << e;
    EXPECT_EQ(back, master) << e;
    EXPECT_EQ(std::vector<float>(store->entry(e).compute_fp32,
                                 store->entry(e).compute_fp32 + specs[e].elements),
              master)
        << e;
  }
}

// Ranks whose placements keep different entries' gradients in RAM (budgets that differ) reduce
// in different pieces: the fingerprint CheckSameJob compares tells them apart, entry by entry.
TEST(GradientLayoutFingerprintTest, SaysWhichEntriesGradientsAreOnNvme) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("grad_fingerprint", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  absl::StatusOr<std::unique_ptr<CpuDevice>> device = SmallCpuDevice(size_t{4} << 20);
  ASSERT_TRUE(device.ok()) << device.status();
  std::vector<EntrySpec> specs(3);
  for (EntrySpec& s : specs) s.elements = 70000;  // two 64 Ki-element chunks, the last short
  const auto fingerprint = [&](const std::string& name, std::vector<int> ram_entries) {
    StorePlacement p;
    p.grad_on_nvme = true;
    p.grad_ram_entries = std::move(ram_entries);
    p.nvme_chunk_bytes = size_t{256} << 10;
    p.nvme_dir = dir + "/" + name;
    std::filesystem::create_directories(p.nvme_dir);
    absl::StatusOr<ParameterStore> store = ParameterStore::Create(**device, specs, p);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? GradientLayoutFingerprint(*store) : std::string();
  };
  const std::string embedding_only = fingerprint("a", {0});
  EXPECT_EQ(embedding_only, "70000 nvme:65536:4464 nvme:65536:4464 ");
  const std::string kept_one_more = fingerprint("b", {0, 1});
  EXPECT_EQ(kept_one_more, "70000 70000 nvme:65536:4464 ");
  EXPECT_EQ(fingerprint("c", {0, 1}), kept_one_more);
}

// Trainer::Create's answer for a small untied model on a CPU device under `o`.
absl::Status CreateSmallTrainer(TrainerOptions o) {
  DeviceOptions options;
  options.kind = DeviceKind::kCpu;
  options.arena_bytes = size_t{64} << 20;
  options.pinned_budget_bytes = size_t{64} << 20;
  absl::StatusOr<std::unique_ptr<CpuDevice>> device = CpuDevice::Create(options);
  if (!device.ok()) return device.status();
  const absl::StatusOr<ModelConfig> config = ParseModelConfig(
      R"({"model_type": "llama", "vocab_size": 97, "hidden_size": 48, "intermediate_size": 88,
          "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2,
          "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
          "hidden_act": "silu", "tie_word_embeddings": false})");
  if (!config.ok()) return config.status();
  o.micro_batch_size = 1;
  o.seq_len = 8;
  return Trainer::Create(**device, *config, o).status();
}

TEST(Zero1TrainerTest, NeedsACommunicator) {
  TrainerOptions o;
  o.zero1 = true;
  const absl::Status s = CreateSmallTrainer(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("zero1 needs a communicator"), std::string::npos) << s;
}

// A zero or negative deadline would fail every collective at once; none is InfiniteDuration.
TEST(CollectiveTimeoutTest, MustBePositive) {
  for (absl::Duration bad : {absl::ZeroDuration(), absl::Seconds(-1)}) {
    TrainerOptions o;
    o.collective_timeout = bad;
    const absl::Status s = CreateSmallTrainer(o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("collective_timeout=" + absl::FormatDuration(bad)),
              std::string::npos)
        << s;
  }
  TrainerOptions o;
  o.collective_timeout = absl::InfiniteDuration();
  EXPECT_TRUE(CreateSmallTrainer(o).ok());
}

}  // namespace
}  // namespace megatrain::engine
