// Tests of the placement planner with realistic (Llama-2 7B) and odd sizes.
#include "engine/tiers/placement.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::engine::tiers {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr uint64_t kGiB = 1ull << 30;

// Llama-2 7B entries: embedding, 32 layers, final norm + LM head; bytes per parameter 4/4/4/4
// and a bf16 compute copy of 2 on a GPU (none on the CPU device).
std::vector<EntryBytes> Llama7b(bool gpu) {
  const uint64_t hidden = 4096, ffn = 11008, vocab = 32000;
  const uint64_t layer = 4 * hidden * hidden + 3 * hidden * ffn + 2 * hidden;
  std::vector<uint64_t> params = {vocab * hidden};
  for (int i = 0; i < 32; ++i) params.push_back(layer);
  params.push_back(vocab * hidden + hidden);
  std::vector<EntryBytes> entries;
  for (uint64_t n : params) {
    EntryBytes e;
    e[BufferKind::kMaster] = e[BufferKind::kM] = e[BufferKind::kV] = e[BufferKind::kGrad] = 4 * n;
    e[BufferKind::kComputeCopy] = gpu ? 2 * n : 0;
    entries.push_back(e);
  }
  return entries;
}

uint64_t Total(const std::vector<EntryBytes>& entries, BufferKind k) {
  uint64_t t = 0;
  for (const EntryBytes& e : entries) t += e[k];
  return t;
}

TEST(PlanPlacement, SevenBillionOnGpuWith64GiBRamMovesStatesToNvme) {
  const auto entries = Llama7b(/*gpu=*/true);
  const TierBudgets budgets{16 * kGiB, 64 * kGiB, "/nvme/megatrain", 1024 * kGiB};
  absl::StatusOr<Placement> p = PlanPlacement(entries, budgets);
  ASSERT_TRUE(p.ok()) << p.status();
  // 27 GB of gradients do not fit 16 GiB pinned: pageable; the 13.5 GB bf16 copy does.
  EXPECT_EQ(p->tier(BufferKind::kGrad), Tier::kRam);
  EXPECT_TRUE(p->of(BufferKind::kGrad).wanted_pinned);
  EXPECT_EQ(p->tier(BufferKind::kComputeCopy), Tier::kPinned);
  EXPECT_EQ(p->tier(BufferKind::kMaster), Tier::kRam);
  EXPECT_EQ(p->tier(BufferKind::kM), Tier::kNvme);
  EXPECT_EQ(p->tier(BufferKind::kV), Tier::kNvme);
  EXPECT_LE(p->pinned_used, budgets.pinned_ram);
  EXPECT_LE(p->ram_used, budgets.ram);
  EXPECT_EQ(p->nvme_used, Total(entries, BufferKind::kM) * 2);
  // Staging: 5 slots of one 64 MiB chunk of m and of v, not of the largest entry (a decoder
  // layer of 202,383,360 floats would need 8.1 GB).
  EXPECT_EQ(p->staging_bytes, 5ull * 2 * (64ull << 20));
  const std::string table = p->Table();
  EXPECT_THAT(table, AllOf(HasSubstr("m             nvme"), HasSubstr("grad          ram"),
                           HasSubstr("nvme_staging"), HasSubstr("pinned budget full")));
}

TEST(PlanPlacement, SevenBillionWith32GiBRamNeedsTheMasterOnNvmeToo) {
  const auto entries = Llama7b(/*gpu=*/true);
  absl::StatusOr<Placement> p =
      PlanPlacement(entries, {16 * kGiB, 48 * kGiB, "/nvme/megatrain", 1024 * kGiB});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->tier(BufferKind::kMaster), Tier::kNvme);
  EXPECT_EQ(p->tier(BufferKind::kGrad), Tier::kRam);
  // With 24 GiB the gradients go too; the RAM left over keeps whole entries' in forward order.
  // By hand: staging 5 slots x 4 kinds x 64 MiB = 1342177280 B; the embedding's gradient
  // 32000 x 4096 x 4 = 524288000 B; a layer's 202383360 x 4 = 809533440 B; 24 GiB -
  // 1866465280 B = 23903338496 B hold 29 layers (23476469760 B), not 30.
  p = PlanPlacement(entries, {16 * kGiB, 24 * kGiB, "/nvme/megatrain", 1024 * kGiB});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->tier(BufferKind::kGrad), Tier::kNvme);
  EXPECT_EQ(p->tier(BufferKind::kComputeCopy), Tier::kPinned);
  ASSERT_EQ(entries[1][BufferKind::kGrad], 809533440u);
  EXPECT_EQ(p->grad_kept_entries.size(), 30u);  // entry 0 (the embedding) and entries 1-29
  EXPECT_EQ(p->grad_ram_entries, p->grad_kept_entries);
  EXPECT_EQ(p->ram_used, uint64_t{1342177280} + 524288000 + 29 * uint64_t{809533440});
  EXPECT_THAT(p->Table(), HasSubstr("of it in RAM: entries 0-29's)"));
  // With 1 GiB even the staging does not fit: the message says how much is missing and for what.
  absl::StatusOr<Placement> refused =
      PlanPlacement(entries, {16 * kGiB, 1 * kGiB, "/nvme/megatrain", 1024 * kGiB});
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              AllOf(HasSubstr("more of RAM (ram=1073741824) for NVMe staging")));
}

TEST(PlanPlacement, NvmeTooSmallIsRefusedNamingTheStates) {
  const auto entries = Llama7b(/*gpu=*/false);
  absl::StatusOr<Placement> p =
      PlanPlacement(entries, {32 * kGiB, 32 * kGiB, "/nvme/megatrain", 40 * kGiB});
  ASSERT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(p.status().message(),
              AllOf(HasSubstr("more of NVMe (nvme_bytes=42949672960 in /nvme/megatrain) for m"),
                    HasSubstr("+ v ")));
}

TEST(PlanPlacement, CpuDeviceKeepsTheMasterAsPinnedCopySource) {
  const auto entries = Llama7b(/*gpu=*/false);
  absl::StatusOr<Placement> p =
      PlanPlacement(entries, {64 * kGiB, 32 * kGiB, "/nvme/x", 1024 * kGiB});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->tier(BufferKind::kMaster), Tier::kPinned);
  EXPECT_EQ(p->tier(BufferKind::kGrad), Tier::kPinned);
  EXPECT_EQ(p->tier(BufferKind::kComputeCopy), Tier::kAbsent);
  EXPECT_EQ(p->tier(BufferKind::kM), Tier::kNvme);
  EXPECT_FALSE(p->compute_copy_fp32);
}

TEST(PlanPlacement, MasterOnNvmeOnTheCpuDeviceAddsAPinnedFp32ComputeCopy) {
  // Odd sizes: three entries of 4 * 1013, 4 * 1020 and 4 * 1027 bytes per kind.
  std::vector<EntryBytes> entries(3);
  for (int i = 0; i < 3; ++i) {
    for (BufferKind k : {BufferKind::kMaster, BufferKind::kM, BufferKind::kV, BufferKind::kGrad}) {
      entries[i][k] = 4 * (1013 + 7 * i);
    }
  }
  const uint64_t per_kind = 4 * (1013 + 1020 + 1027), largest = 4 * 1027;
  absl::StatusOr<Placement> p = PlanPlacement(entries, {2 * per_kind, 1 << 20, "/d", 1 << 20},
                                              {.staging_slots = 5, .master_on_nvme = true});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->compute_copy_fp32);
  EXPECT_EQ(p->tier(BufferKind::kComputeCopy), Tier::kPinned);
  EXPECT_EQ(p->of(BufferKind::kComputeCopy).bytes, per_kind);
  EXPECT_EQ(p->of(BufferKind::kComputeCopy).largest_entry, largest);
  EXPECT_EQ(p->tier(BufferKind::kGrad), Tier::kPinned);
  for (BufferKind k : {BufferKind::kMaster, BufferKind::kM, BufferKind::kV}) {
    EXPECT_EQ(p->tier(k), Tier::kNvme) << BufferKindName(k);
  }
  EXPECT_EQ(p->nvme_used, 3 * per_kind);
  // Five slots, each holding the largest entry's m, v and master.
  EXPECT_EQ(p->staging_bytes, 5 * 3 * largest);
  EXPECT_EQ(p->pinned_used, 2 * per_kind);
  EXPECT_EQ(p->ram_used, p->staging_bytes);
  EXPECT_THAT(p->Table(), AllOf(HasSubstr("master        nvme"), HasSubstr("compute_copy  pinned"),
                                HasSubstr("fp32")));
  // The copy is counted: a pinned budget holding only the gradients leaves it pageable.
  p = PlanPlacement(entries, {per_kind, 1 << 20, "/d", 1 << 20}, {.master_on_nvme = true});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->tier(BufferKind::kComputeCopy), Tier::kRam);
  EXPECT_TRUE(p->of(BufferKind::kComputeCopy).wanted_pinned);
  // Without an NVMe directory the request is refused naming the option.
  EXPECT_THAT(PlanPlacement(entries, {per_kind, 1 << 20, "", 0}, {.master_on_nvme = true})
                  .status()
                  .message(),
              HasSubstr("master_on_nvme"));
}

TEST(PlanPlacement, GpuMasterGoesToNvmeOnlyAfterTheStatesOrWhenAsked) {
  const auto entries = Llama7b(/*gpu=*/true);
  // RAM holds everything: nothing moves unless asked.
  const TierBudgets roomy{16 * kGiB, 512 * kGiB, "/nvme/megatrain", 1024 * kGiB};
  absl::StatusOr<Placement> p = PlanPlacement(entries, roomy);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->tier(BufferKind::kMaster), Tier::kRam);
  EXPECT_EQ(p->tier(BufferKind::kM), Tier::kRam);
  p = PlanPlacement(entries, roomy, {.master_on_nvme = true});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->compute_copy_fp32);  // the bf16 copy is the copy-in source
  EXPECT_EQ(p->tier(BufferKind::kMaster), Tier::kNvme);
  EXPECT_EQ(p->tier(BufferKind::kM), Tier::kNvme);
  EXPECT_EQ(p->tier(BufferKind::kComputeCopy), Tier::kPinned);
  EXPECT_EQ(p->nvme_used, 3 * Total(entries, BufferKind::kMaster));
}

// The speculative update's alternate regions: a second copy of master, m and v counted in
// nvme_used when the budget holds it; else off, and the table says why either way.
TEST(PlanPlacement, AlternateStateRegionsAreCountedOrRefusedWithAReason) {
  const auto entries = Llama7b(/*gpu=*/true);
  const uint64_t state = 3 * Total(entries, BufferKind::kMaster);
  TierBudgets budgets{16 * kGiB, 512 * kGiB, "/nvme/megatrain", 2 * state};
  absl::StatusOr<Placement> p = PlanPlacement(entries, budgets, {.master_on_nvme = true});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(ReserveAlternateStateRegions(*p));
  EXPECT_EQ(p->alternate_state_bytes, state);
  EXPECT_EQ(p->nvme_used, 2 * state);
  EXPECT_THAT(p->Table(), HasSubstr("speculative update on: alternate master/m/v regions"));
  budgets.nvme_bytes = 2 * state - 1;
  p = PlanPlacement(entries, budgets, {.master_on_nvme = true});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(ReserveAlternateStateRegions(*p));
  EXPECT_EQ(p->nvme_used, state);
  EXPECT_THAT(p->Table(), HasSubstr("speculative update off: its alternate master/m/v regions "
                                    "need"));
}

// The mixed form: the master in RAM, m and v on NVMe. Alternate regions for m and v count
// against NVMe, the master's alternate array against the master's RAM tier (pageable on a GPU,
// pinned on the CPU device where it is the copy endpoint); one byte short of either tier turns
// it off naming the bytes. Other mixes (the master on NVMe beside m and v in RAM, m and v apart)
// stay off.
TEST(PlanPlacement, MixedFormCountsMvRegionsOnNvmeAndTheMasterArrayInItsTier) {
  const auto gpu = Llama7b(/*gpu=*/true);
  const uint64_t master = Total(gpu, BufferKind::kMaster);
  TierBudgets budgets{16 * kGiB, 512 * kGiB, "/nvme/megatrain", 4 * master};
  absl::StatusOr<Placement> p = PlanPlacement(gpu, budgets, {.states_on_nvme = true});
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(MasterInRamStatesOnNvme(*p));
  EXPECT_FALSE(MasterAndStatesOnNvme(*p));
  EXPECT_FALSE(MasterAndStatesInRam(*p));
  ASSERT_EQ(p->tier(BufferKind::kMaster), Tier::kRam);
  const uint64_t ram_before = p->ram_used, pinned_before = p->pinned_used;
  EXPECT_EQ(p->nvme_used, 2 * master);
  EXPECT_TRUE(ReserveAlternateStateRegions(*p));
  EXPECT_EQ(p->alternate_state_bytes, 2 * master);
  EXPECT_EQ(p->alternate_ram_bytes, master);
  EXPECT_EQ(p->nvme_used, 4 * master);
  EXPECT_EQ(p->ram_used, ram_before + master);
  EXPECT_EQ(p->pinned_used, pinned_before);
  EXPECT_THAT(p->Table(),
              HasSubstr(absl::StrCat("speculative update on: alternate m/v regions ",
                                     FormatBytes(2 * master), " on NVMe and master array ",
                                     FormatBytes(master), " in RAM (0 B pinned, ", master,
                                     " B pageable)")));
  // One byte short of NVMe, then of RAM: off, with what each tier lacks.
  budgets.nvme_bytes = 4 * master - 1;
  p = PlanPlacement(gpu, budgets, {.states_on_nvme = true});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(ReserveAlternateStateRegions(*p));
  EXPECT_EQ(p->nvme_used, 2 * master);
  EXPECT_EQ(p->ram_used, ram_before);
  EXPECT_EQ(p->alternate_state_bytes + p->alternate_ram_bytes, 0u);
  EXPECT_THAT(p->Table(),
              HasSubstr(absl::StrCat("speculative update off: its alternate m/v regions and "
                                     "master array need ",
                                     FormatBytes(2 * master), " more of NVMe")));
  EXPECT_THAT(p->Table(), Not(HasSubstr("with master_on_nvme")));  // NVMe is what is short
  budgets.nvme_bytes = 4 * master;
  budgets.ram = ram_before + master - 1;
  p = PlanPlacement(gpu, budgets, {.states_on_nvme = true});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(ReserveAlternateStateRegions(*p));
  EXPECT_THAT(p->Table(), HasSubstr(absl::StrCat("need ", FormatBytes(master), " more of RAM")));
  // Short of RAM only: the master could join m and v on NVMe, where its copy needs no RAM.
  EXPECT_THAT(p->Table(), HasSubstr("with master_on_nvme the master's second copy would go to NVMe"));

  // The CPU device: the master is the pinned copy endpoint, and so is its alternate.
  const auto cpu = Llama7b(/*gpu=*/false);
  budgets = {2 * master + Total(cpu, BufferKind::kGrad), 512 * kGiB, "/nvme/megatrain",
             4 * master};
  p = PlanPlacement(cpu, budgets, {.states_on_nvme = true});
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->tier(BufferKind::kMaster), Tier::kPinned);
  EXPECT_TRUE(ReserveAlternateStateRegions(*p));
  EXPECT_EQ(p->pinned_used, 2 * master + Total(cpu, BufferKind::kGrad));
  EXPECT_THAT(p->Table(), HasSubstr(absl::StrCat("in RAM (", master, " B pinned, 0 B pageable)")));

  Placement other;
  other.kinds[static_cast<int>(BufferKind::kMaster)].tier = Tier::kNvme;
  other.kinds[static_cast<int>(BufferKind::kM)].tier = Tier::kRam;
  other.kinds[static_cast<int>(BufferKind::kV)].tier = Tier::kNvme;
  EXPECT_FALSE(ReserveAlternateStateRegions(other));
  EXPECT_THAT(other.Table(),
              HasSubstr("speculative update off: the master, m and v are neither all on NVMe, "
                        "nor all in RAM, nor the master in RAM with m and v on NVMe"));
}

// The RAM form: with the master, m and v in RAM a second copy of them is counted against the
// tiers they are in (pageable here on a GPU, the master pinned on the CPU device), or refused
// naming the bytes it needs.
TEST(PlanPlacement, AlternateRamStateIsCountedInItsTiersOrRefusedWithItsBytes) {
  const auto gpu = Llama7b(/*gpu=*/true);
  const uint64_t master = Total(gpu, BufferKind::kMaster);
  TierBudgets budgets{16 * kGiB, 512 * kGiB, "", 0};
  absl::StatusOr<Placement> p = PlanPlacement(gpu, budgets);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(MasterAndStatesInRam(*p));
  const uint64_t ram_before = p->ram_used, pinned_before = p->pinned_used;
  EXPECT_TRUE(ReserveAlternateStateRegions(*p));
  EXPECT_EQ(p->alternate_ram_bytes, 3 * master);
  EXPECT_EQ(p->alternate_state_bytes, 0u);
  EXPECT_EQ(p->ram_used, ram_before + 3 * master);
  EXPECT_EQ(p->pinned_used, pinned_before);
  EXPECT_THAT(p->Table(), HasSubstr("speculative update on: alternate master/m/v arrays"));
  // One byte short of RAM: off, saying what it needs.
  budgets.ram = ram_before + 3 * master - 1;
  p = PlanPlacement(gpu, budgets);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(ReserveAlternateStateRegions(*p));
  EXPECT_EQ(p->ram_used, ram_before);
  EXPECT_THAT(p->Table(),
              HasSubstr(absl::StrCat("speculative update off: its alternate master/m/v arrays "
                                     "need ",
                                     FormatBytes(3 * master), " more of RAM")));

  // The CPU device: the master is the pinned copy endpoint, its alternate is pinned too.
  const auto cpu = Llama7b(/*gpu=*/false);
  budgets = {2 * master + Total(cpu, BufferKind::kGrad), 512 * kGiB, "", 0};
  p = PlanPlacement(cpu, budgets);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->tier(BufferKind::kMaster), Tier::kPinned);
  EXPECT_TRUE(ReserveAlternateStateRegions(*p));
  EXPECT_EQ(p->pinned_used, 2 * master + Total(cpu, BufferKind::kGrad));
  budgets.pinned_ram -= 1;
  p = PlanPlacement(cpu, budgets);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(ReserveAlternateStateRegions(*p));
  EXPECT_THAT(p->Table(), HasSubstr(absl::StrCat(FormatBytes(master), " more of pinned RAM")));
}

TEST(PlanPlacement, EverythingInRamWhenItFitsAndNoNvmeMeansAClearRefusal) {
  std::vector<EntryBytes> entries(3);
  for (int i = 0; i < 3; ++i) {
    for (int k = 0; k < 4; ++k) entries[i].bytes[k] = 1000 + 7 * i;
  }
  absl::StatusOr<Placement> p = PlanPlacement(entries, {10000, 10000, "", 0});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->any_on_nvme());
  EXPECT_EQ(p->pinned_used, 2 * 3021u);
  EXPECT_EQ(p->ram_used, 2 * 3021u);
  absl::StatusOr<Placement> refused = PlanPlacement(entries, {0, 10000, "", 0});
  EXPECT_THAT(refused.status().message(),
              AllOf(HasSubstr("needs 2084 B"), HasSubstr("no nvme_dir is set")));
  // Forcing the states to NVMe with room to spare is honoured (and the staging is charged).
  p = PlanPlacement(entries, {10000, 10000, "/d", 1 << 20},
                    {.staging_slots = 3, .states_on_nvme = true});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->tier(BufferKind::kV), Tier::kNvme);
  EXPECT_EQ(p->staging_bytes, 3u * 2 * 1014);
}

// Qwen2.5-1.5B on the CPU device (tied: embedding 151936 x 1536, 28 layers, final norm).
std::vector<EntryBytes> Qwen15bCpu() {
  const uint64_t hidden = 1536, ffn = 8960, vocab = 151936, kv = 256;
  const uint64_t layer =
      hidden * hidden * 2 + hidden * kv * 2 + hidden + 2 * kv + 3 * hidden * ffn + 2 * hidden;
  std::vector<uint64_t> params = {vocab * hidden};
  for (int i = 0; i < 28; ++i) params.push_back(layer);
  params.push_back(hidden);
  std::vector<EntryBytes> entries;
  for (uint64_t n : params) {
    EntryBytes e;
    e[BufferKind::kMaster] = e[BufferKind::kM] = e[BufferKind::kV] = e[BufferKind::kGrad] = 4 * n;
    e.grad_stays_in_ram = entries.empty();
    entries.push_back(e);
  }
  return entries;
}

// The mixed form at the 1.5B shape on the CPU device: with 16 GiB of RAM the RAM left over
// would keep every gradient, leaving no room for the alternate master (off); asked for the
// speculative update, step 3 keeps gradients only in what the alternate master leaves (entries
// 1-15) and it is on. Under 10 GiB the second master cannot fit at all: nothing changes.
TEST(PlanPlacement, TheSpeculativeUpdatesAlternateMasterComesBeforeKeptGradients) {
  const auto entries = Qwen15bCpu();
  const uint64_t master = Total(entries, BufferKind::kMaster);
  const uint64_t layer = entries[1][BufferKind::kGrad];
  const TierBudgets budgets{0, 16 * kGiB, "/nvme/megatrain", 60 * kGiB};
  absl::StatusOr<Placement> plain = PlanPlacement(entries, budgets);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->tier(BufferKind::kGrad), Tier::kRam);
  EXPECT_FALSE(ReserveAlternateStateRegions(*plain));
  EXPECT_THAT(plain->Table(), HasSubstr(absl::StrCat("need ", FormatBytes(master),
                                                     " more of RAM")));

  absl::StatusOr<Placement> p = PlanPlacement(entries, budgets, {.speculative_update = true});
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(MasterInRamStatesOnNvme(*p));
  EXPECT_EQ(p->tier(BufferKind::kGrad), Tier::kNvme);
  // 16 GiB - master twice - the embedding's gradient - staging = 2890027008 B: 15 layers.
  EXPECT_EQ(p->grad_kept_entries,
            (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_TRUE(ReserveAlternateStateRegions(*p));
  EXPECT_EQ(p->alternate_ram_bytes, master);
  EXPECT_EQ(p->alternate_state_bytes, 2 * master);
  EXPECT_EQ(p->ram_used, 2 * master + 933494784u + 1006632960u + 15 * layer);
  EXPECT_LE(p->ram_used, budgets.ram);

  const TierBudgets ten{0, 10 * kGiB, "/nvme/megatrain", 60 * kGiB};
  absl::StatusOr<Placement> asked = PlanPlacement(entries, ten, {.speculative_update = true});
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_EQ(asked->grad_kept_entries.size(), 14u);
  EXPECT_FALSE(ReserveAlternateStateRegions(*asked));
}

TEST(PlanPlacement, StagingIsChunksNotTheLargestEntry) {
  const auto entries = Qwen15bCpu();
  const uint64_t embedding = entries[0][BufferKind::kM];
  ASSERT_GT(embedding, 890ull << 20);
  const TierBudgets budgets{0, 10 * kGiB, "/nvme/megatrain", 60 * kGiB};
  absl::StatusOr<Placement> p = PlanPlacement(entries, budgets);
  ASSERT_TRUE(p.ok()) << p.status();
  // m, v and then the gradients move; the master is the CPU device's copy source and stays.
  EXPECT_EQ(p->tier(BufferKind::kM), Tier::kNvme);
  EXPECT_EQ(p->tier(BufferKind::kGrad), Tier::kNvme);
  EXPECT_EQ(p->tier(BufferKind::kMaster), Tier::kRam);
  EXPECT_EQ(p->staging_bytes, 5ull * 3 * (64ull << 20));
  // By hand: a layer is 46797824 params = 187191296 B; the master is 6174857216 B, the
  // embedding's gradient 933494784 B, staging 1006632960 B, so 10 GiB - 8114984960 B =
  // 2622433280 B are left, which hold 14 layers' gradients (2620678144 B), not 15.
  const uint64_t layer = entries[1][BufferKind::kGrad];
  ASSERT_EQ(layer, 187191296u);
  ASSERT_EQ(Total(entries, BufferKind::kMaster), 6174857216u);
  EXPECT_EQ(p->grad_kept_entries,
            (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}));
  EXPECT_EQ(p->of(BufferKind::kGrad).ram_resident, embedding + 14 * layer);
  EXPECT_EQ(p->ram_used, 6174857216u + 933494784u + 1006632960u + 2620678144u);
  EXPECT_EQ(p->nvme_used, 2 * Total(entries, BufferKind::kM) + Total(entries, BufferKind::kGrad) -
                              embedding - 14 * layer);
  EXPECT_FALSE(p->grad_on_nvme(0));
  EXPECT_FALSE(p->grad_on_nvme(14));
  EXPECT_TRUE(p->grad_on_nvme(15));
  EXPECT_TRUE(p->grad_on_nvme(29));
  EXPECT_THAT(p->Table(), HasSubstr("(3554172928 B (3.31 GiB) of it in RAM: the embedding's and "
                                    "entries 1-14's)"));
  // Smaller chunks, smaller staging; asked for, the gradients move with RAM to spare.
  p = PlanPlacement(entries, {0, 64 * kGiB, "/nvme/megatrain", 60 * kGiB},
                    {.chunk_bytes = 1 << 20, .grad_on_nvme = true});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->tier(BufferKind::kGrad), Tier::kNvme);
  EXPECT_EQ(p->tier(BufferKind::kM), Tier::kNvme);
  EXPECT_EQ(p->staging_bytes, 5ull * 3 * (1 << 20));
  // Asked for, only the embedding's gradient stays in RAM, however much RAM is left.
  EXPECT_EQ(p->grad_ram_entries, std::vector<int>{0});
  EXPECT_TRUE(p->grad_kept_entries.empty());
  EXPECT_EQ(p->of(BufferKind::kGrad).ram_resident, embedding);
  EXPECT_THAT(p->Table(), HasSubstr("of it in RAM: the embedding's)"));
  // A chunk that is not a multiple of the gradient norm's 256 KiB chunk is refused by name.
  EXPECT_THAT(PlanPlacement(entries, budgets, {.chunk_bytes = 1000}).status().message(),
              HasSubstr("nvme_chunk_bytes=1000"));
}

// Four entries of 100 B per kind, none marked to stay in RAM, one staging slot of whole entries.
std::vector<EntryBytes> FourEntries() {
  std::vector<EntryBytes> entries(4);
  for (EntryBytes& e : entries) {
    e[BufferKind::kMaster] = e[BufferKind::kM] = e[BufferKind::kV] = e[BufferKind::kGrad] = 100;
  }
  return entries;
}

TEST(PlanPlacement, LeftOverRamKeepsWholeEntriesGradientsInForwardOrder) {
  const auto entries = FourEntries();
  const PlacementOptions one_slot{.staging_slots = 1};
  // master 400 + staging of m, v, grad 300 = 700: 1 entry's gradient fits 820, 2 do not (900).
  // (Every gradient in RAM with m and v moved needs 400 + 400 + 200 = 1000, over budget.)
  absl::StatusOr<Placement> p = PlanPlacement(entries, {0, 820, "/nvme", 4000}, one_slot);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->tier(BufferKind::kGrad), Tier::kNvme);
  EXPECT_EQ(p->grad_kept_entries, std::vector<int>{0});
  EXPECT_EQ(p->grad_ram_entries, std::vector<int>{0});
  EXPECT_EQ(p->of(BufferKind::kGrad).ram_resident, 100u);
  EXPECT_EQ(p->ram_used, 800u);
  EXPECT_EQ(p->nvme_used, 400u + 400u + 300u);
  EXPECT_FALSE(p->grad_on_nvme(0));
  EXPECT_TRUE(p->grad_on_nvme(1));
  EXPECT_THAT(p->Table(), HasSubstr("(100 B (0.00 GiB) of it in RAM: entry 0's)"));
  // With m and v moved, 1000 B would hold every gradient: 999 B moves them and keeps 2 (900).
  p = PlanPlacement(entries, {0, 999, "/nvme", 4000}, one_slot);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->grad_kept_entries, (std::vector<int>{0, 1}));
  EXPECT_THAT(p->Table(), HasSubstr("of it in RAM: entries 0-1's)"));
  // A compute copy of 300 B per entry moves after the gradients (RAM: staging 3 x 100 + 300 +
  // the gradients' 100 = 700); then 3 gradients fit (1000), and the 4th too once the gradients'
  // staging goes (400 + 600 = 1000): the kind is back in RAM, pageable, with no file.
  std::vector<EntryBytes> with_copy = entries;
  for (EntryBytes& e : with_copy) e[BufferKind::kComputeCopy] = 300;
  p = PlanPlacement(with_copy, {0, 1000, "/nvme", 4000}, one_slot);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->tier(BufferKind::kComputeCopy), Tier::kNvme);
  EXPECT_EQ(p->tier(BufferKind::kGrad), Tier::kRam);
  EXPECT_TRUE(p->grad_ram_entries.empty());
  EXPECT_FALSE(p->grad_on_nvme(3));
  EXPECT_EQ(p->ram_used, 400u + 3 * 100u + 300u) << p->Table();
  EXPECT_EQ(p->nvme_used, 400u * 3 + 1200u);
  // Nothing left over: every gradient on NVMe.
  p = PlanPlacement(entries, {0, 700, "/nvme", 4000}, one_slot);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->grad_ram_entries.empty());
  EXPECT_TRUE(p->grad_on_nvme(0));
  EXPECT_EQ(p->of(BufferKind::kGrad).ram_resident, 0u);
}

TEST(PlanPlacement, BadBudgetsNameTheField) {
  std::vector<EntryBytes> entries(1);
  EXPECT_THAT(PlanPlacement(entries, {0, 0, "/d", 0}).status().message(),
              HasSubstr("nvme_bytes=0"));
  EXPECT_THAT(PlanPlacement(entries, {0, 0, "", 5}).status().message(),
              HasSubstr("nvme_bytes=5 without an nvme_dir"));
  EXPECT_THAT(PlanPlacement(entries, {}, {.staging_slots = 0}).status().message(),
              HasSubstr("staging_slots=0"));
}

// The executors' pinned staging is set aside before the store: copy endpoints that fit the
// whole budget but not what is left go pageable, and the table says both.
TEST(PlanPlacement, PinnedReservedComesOutOfThePinnedBudget) {
  const auto entries = Llama7b(/*gpu=*/true);
  const uint64_t copy = Total(entries, BufferKind::kComputeCopy);
  const TierBudgets budgets{copy, 256 * kGiB, "", 0};
  absl::StatusOr<Placement> whole = PlanPlacement(entries, budgets);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->tier(BufferKind::kComputeCopy), Tier::kPinned);
  PlacementOptions options;
  options.pinned_reserved = 1;
  absl::StatusOr<Placement> p = PlanPlacement(entries, budgets, options);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->tier(BufferKind::kComputeCopy), Tier::kRam);
  EXPECT_TRUE(p->of(BufferKind::kComputeCopy).wanted_pinned);
  EXPECT_EQ(p->pinned_used, 0u);
  EXPECT_EQ(p->pinned_reserved, 1u);
  EXPECT_THAT(
      p->Table(),
      AllOf(HasSubstr("exec_staging  pinned  1 B"), HasSubstr("(pageable: pinned budget full)"),
            HasSubstr("budget use: pinned 0/" + std::to_string(copy) + " (+1 executor staging)")));
  // A reserve beyond the budget leaves the store no pinned bytes at all.
  options.pinned_reserved = 2 * copy;
  p = PlanPlacement(entries, budgets, options);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->pinned_used, 0u);
}

}  // namespace
}  // namespace megatrain::engine::tiers
