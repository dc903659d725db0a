// The parameter store with the fp32 master on the NVMe tier: masters round-trip through the
// state file beside m and v, the fp32 compute copy follows every write, configurations without a
// compute copy are refused, and I/O faults on the master array name the file and the offset.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/device/cpu_device.h"
#include "engine/exec/parameter_store.h"
#include "engine/tiers/fault_injecting_block_io.h"
#include "engine/tiers/test_dir.h"
#include "engine/tiers/uring_block_io.h"

namespace megatrain::engine {
namespace {

// Odd sizes: none a multiple of a block (1024 floats) or of a SIMD width.
const std::vector<size_t> kSizes = {1013, 3001, 517, 2049};

std::unique_ptr<CpuDevice> MakeDevice() {
  DeviceOptions o;
  o.arena_bytes = size_t{1} << 20;
  o.pinned_budget_bytes = size_t{64} << 20;
  absl::StatusOr<std::unique_ptr<CpuDevice>> d = CpuDevice::Create(o);
  if (!d.ok()) abort();
  return std::move(*d);
}

std::vector<EntrySpec> Specs() {
  std::vector<EntrySpec> specs;
  for (size_t n : kSizes) {
    EntrySpec s;
    s.elements = n;
    s.segments.push_back(AdamwSegment{0, n, true});
    specs.push_back(s);
  }
  return specs;
}

StorePlacement MasterOnNvme(const std::string& dir) {
  StorePlacement p;
  p.master_pinned = false;
  p.compute_copy_fp32 = true;
  p.states_on_nvme = true;
  p.master_on_nvme = true;
  p.nvme_dir = dir;
  return p;
}

std::vector<float> Values(size_t n, int salt) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.001f * static_cast<float>((i * 31 + salt * 7) % 977);
  return v;
}

bool SameBits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

TEST(MasterOnNvmeStoreTest, MastersRoundTripBesideTheStatesAndTheComputeCopyFollows) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("master_store_roundtrip", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  auto device = MakeDevice();
  absl::StatusOr<ParameterStore> store =
      ParameterStore::Create(*device, Specs(), MasterOnNvme(dir));
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE(store->master_on_nvme());
  ASSERT_NE(store->state_store(), nullptr);
  EXPECT_EQ(store->state_store()->arrays_per_entry(), 3);

  for (int e = 0; e < store->num_entries(); ++e) {
    const EntryBuffers b = store->entry(e);
    EXPECT_EQ(b.master, nullptr) << e;
    EXPECT_EQ(b.m, nullptr) << e;
    ASSERT_NE(b.compute_fp32, nullptr) << e;
    EXPECT_EQ(b.fp32_weights(), b.compute_fp32) << e;
    const std::vector<float> master = Values(b.elements, e);
    ASSERT_TRUE(store->WriteMaster(e, master.data()).ok());
    EXPECT_TRUE(SameBits(b.compute_fp32, master.data(), b.elements)) << e;
    // m and v written after the master leave it alone, and the other way round.
    const std::vector<float> m = Values(b.elements, 100 + e), v = Values(b.elements, 200 + e);
    ASSERT_TRUE(store->WriteOptimizerState(e, m.data(), v.data()).ok());
  }
  ASSERT_TRUE(store->Flush().ok());
  // Read back in reverse so entries come from the file, not only from staging.
  for (int e = store->num_entries() - 1; e >= 0; --e) {
    const size_t n = kSizes[e];
    std::vector<float> master(n), m(n), v(n);
    ASSERT_TRUE(store->ReadMaster(e, master.data()).ok());
    ASSERT_TRUE(store->ReadOptimizerState(e, m.data(), v.data()).ok());
    EXPECT_TRUE(SameBits(master.data(), Values(n, e).data(), n)) << e;
    EXPECT_TRUE(SameBits(m.data(), Values(n, 100 + e).data(), n)) << e;
    EXPECT_TRUE(SameBits(v.data(), Values(n, 200 + e).data(), n)) << e;
  }
  // The file holds three block-rounded arrays per entry.
  uint64_t expected = 0;
  for (size_t n : kSizes) expected += 3 * tiers::RoundUpToBlock(n * sizeof(float));
  EXPECT_EQ(store->state_store()->file_bytes(), expected);
}

TEST(MasterOnNvmeStoreTest, AMasterOnNvmeNeedsAComputeCopyAndTheStatesThere) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("master_store_refusals", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  auto device = MakeDevice();
  StorePlacement no_copy = MasterOnNvme(dir);
  no_copy.compute_copy_fp32 = false;
  absl::StatusOr<ParameterStore> refused = ParameterStore::Create(*device, Specs(), no_copy);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("compute copy"), std::string::npos) << refused.status();
  StorePlacement no_states = MasterOnNvme(dir);
  no_states.states_on_nvme = false;
  refused = ParameterStore::Create(*device, Specs(), no_states);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("states_on_nvme"), std::string::npos)
      << refused.status();
  StorePlacement both = MasterOnNvme(dir);
  both.compute_copy_bf16 = true;
  EXPECT_EQ(ParameterStore::Create(*device, Specs(), both).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A store whose requests are single blocks, so a fault can be aimed at the master array alone.
struct FaultyStore {
  std::unique_ptr<tiers::UringBlockIo> uring;
  std::unique_ptr<tiers::FaultInjectingBlockIo> faults;
  std::unique_ptr<CpuDevice> device;
  std::optional<ParameterStore> store;
};

FaultyStore MakeFaultyStore(const std::string& dir) {
  FaultyStore f;
  absl::StatusOr<std::unique_ptr<tiers::UringBlockIo>> uring = tiers::UringBlockIo::Create();
  if (!uring.ok()) abort();
  f.uring = std::move(*uring);
  f.faults = std::make_unique<tiers::FaultInjectingBlockIo>(*f.uring);
  f.device = MakeDevice();
  StorePlacement p = MasterOnNvme(dir);
  p.block_io = f.faults.get();
  p.nvme_request_bytes = tiers::kDirectIoAlignment;
  absl::StatusOr<ParameterStore> store = ParameterStore::Create(*f.device, Specs(), p);
  if (!store.ok()) abort();
  f.store.emplace(std::move(*store));
  return f;
}

// The "offset N" of an I/O error message.
uint64_t OffsetIn(const std::string& message) {
  const size_t at = message.find("offset ");
  if (at == std::string::npos) return UINT64_MAX;
  return std::stoull(message.substr(at + 7));
}

TEST(MasterOnNvmeStoreTest, FaultsOnTheMasterArrayNameTheFileAndTheOffset) {
  absl::Status usable;
  const std::string dir = tiers::FreshTestDir("master_store_faults", &usable);
  if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
  constexpr int kEntry = 1;
  for (tiers::InjectedFault fault : {tiers::InjectedFault::kEio, tiers::InjectedFault::kTruncate}) {
    FaultyStore f = MakeFaultyStore(dir);
    const tiers::NvmeStateStore& states = *f.store->state_store();
    const uint64_t begin = states.array_offset(kEntry, ParameterStore::kMasterArray);
    const uint64_t end = begin + states.array_bytes(kEntry);
    // The third block of entry 1's master array.
    f.faults->FailNthOfRange(tiers::IoOp::kRead, begin, end, 3, fault);
    std::vector<float> master(kSizes[kEntry]);
    const absl::Status s = f.store->ReadMaster(kEntry, master.data());
    ASSERT_FALSE(s.ok());
    const std::string message(s.message());
    EXPECT_NE(message.find(states.path()), std::string::npos) << message;
    EXPECT_EQ(OffsetIn(message), begin + 2 * tiers::kDirectIoAlignment) << message;
    // Sticky: later calls fail too, never serve a half-read master.
    EXPECT_FALSE(f.store->ReadMaster(kEntry, master.data()).ok());
  }
  // A full disk while a written master is written back.
  FaultyStore f = MakeFaultyStore(dir);
  const tiers::NvmeStateStore& states = *f.store->state_store();
  const uint64_t begin = states.array_offset(kEntry, ParameterStore::kMasterArray);
  f.faults->FailNthOfRange(tiers::IoOp::kWrite, begin, begin + states.array_bytes(kEntry), 1,
                           tiers::InjectedFault::kEnospc);
  absl::Status s;
  for (int e = 0; e < f.store->num_entries() && s.ok(); ++e) {
    s = f.store->WriteMaster(e, Values(kSizes[e], e).data());
  }
  if (s.ok()) s = f.store->Flush();
  ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  const std::string message(s.message());
  EXPECT_NE(message.find(states.path()), std::string::npos) << message;
  EXPECT_NE(message.find("disk full"), std::string::npos) << message;
  EXPECT_EQ(OffsetIn(message), begin) << message;
}

}  // namespace
}  // namespace megatrain::engine
