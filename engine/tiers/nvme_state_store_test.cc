// Tests of NvmeStateStore: bitwise equality with in-RAM updates under a small staging budget,
// read-after-write safety, resume, and injected faults naming file and offset.
#include "engine/tiers/nvme_state_store.h"

#include <unistd.h>

#include <cstring>
#include <vector>

#include "engine/tiers/fault_injecting_block_io.h"
#include "engine/tiers/test_dir.h"
#include "engine/tiers/uring_block_io.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace megatrain::engine::tiers {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A deterministic moment update (the access pattern of AdamW on m and v).
void Update(int pass, int entry, size_t n, float* m, float* v) {
  for (size_t i = 0; i < n; ++i) {
    const float g =
        static_cast<float>((i * 2654435761u + entry * 97u + pass * 13u) % 1000) / 500.0f - 1.0f;
    m[i] = 0.9f * m[i] + 0.1f * g;
    v[i] = 0.999f * v[i] + 0.001f * g * g;
  }
}

class NvmeStateStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::Status usable;
    dir_ = FreshTestDir(::testing::UnitTest::GetInstance()->current_test_info()->name(), &usable);
    if (!usable.ok()) GTEST_SKIP() << "no O_DIRECT scratch directory: " << usable;
    absl::StatusOr<std::unique_ptr<UringBlockIo>> io = UringBlockIo::Create({.queue_depth = 8});
    if (!io.ok()) GTEST_SKIP() << "io_uring unavailable on this kernel: " << io.status();
    io_ = *std::move(io);
  }

  NvmeStateStoreOptions Options() const {
    NvmeStateStoreOptions o;
    o.dir = dir_;
    o.read_ahead = 2;
    o.max_writes_in_flight = 1;
    o.request_bytes = 3 * kDirectIoAlignment;  // odd request count per entry
    return o;
  }

  // Runs `passes` optimizer passes through the store and on RAM arrays; returns the first error.
  absl::Status RunAndCompare(NvmeStateStore& store, const std::vector<size_t>& sizes, int passes,
                             int first_pass = 0) {
    if (first_pass == 0) {  // fresh arrays start at zero, like a new store
      ram_m_.assign(sizes.size(), {});
      ram_v_.assign(sizes.size(), {});
      for (size_t e = 0; e < sizes.size(); ++e) {
        ram_m_[e].assign(sizes[e], 0.0f);
        ram_v_[e].assign(sizes[e], 0.0f);
      }
    }
    for (int pass = first_pass; pass < first_pass + passes; ++pass) {
      for (int e = 0; e < store.num_entries(); ++e) {
        absl::StatusOr<StagedEntry> staged = store.Acquire(e);
        if (!staged.ok()) return staged.status();
        Update(pass, e, sizes[e], staged->array(0), staged->array(1));
        Update(pass, e, sizes[e], ram_m_[e].data(), ram_v_[e].data());
        if (absl::Status s = store.Release(e); !s.ok()) return s;
      }
    }
    return store.Flush();
  }

  void ExpectStoreEqualsRam(NvmeStateStore& store, const std::vector<size_t>& sizes) {
    for (int e = 0; e < store.num_entries(); ++e) {
      absl::StatusOr<StagedEntry> staged = store.Acquire(e);
      ASSERT_TRUE(staged.ok()) << staged.status();
      EXPECT_EQ(std::memcmp(staged->array(0), ram_m_[e].data(), sizes[e] * 4), 0) << "m " << e;
      EXPECT_EQ(std::memcmp(staged->array(1), ram_v_[e].data(), sizes[e] * 4), 0) << "v " << e;
      ASSERT_TRUE(store.Release(e, /*dirty=*/false).ok());
    }
  }

  std::string dir_;
  std::unique_ptr<UringBlockIo> io_;
  std::vector<std::vector<float>> ram_m_, ram_v_;
};

TEST_F(NvmeStateStoreTest, UpdatesThroughSmallStagingAreBitwiseEqualToRam) {
  std::vector<size_t> sizes;
  for (int e = 0; e < 83; ++e) sizes.push_back(1 + (e * 7919) % 20011);
  auto store = NvmeStateStore::Create(*io_, Options(), sizes);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->staging_slots(), 4);
  EXPECT_LT((*store)->staging_bytes() * 4, (*store)->file_bytes());
  ASSERT_TRUE(RunAndCompare(**store, sizes, 5).ok());
  ExpectStoreEqualsRam(**store, sizes);
  EXPECT_EQ((*store)->stats().bytes_written, 5 * (*store)->file_bytes());
}

TEST_F(NvmeStateStoreTest, FewerEntriesThanSlotsNeverReadOverAPendingWrite) {
  for (int n : {1, 2, 3}) {
    std::vector<size_t> sizes(n, 4099);
    auto store = NvmeStateStore::Create(*io_, Options(), sizes);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE(RunAndCompare(**store, sizes, 6).ok());
    ExpectStoreEqualsRam(**store, sizes);
  }
}

// A ZeRO-1 rank's store: only its run of entries holds bytes; the others are empty. The file is
// its entries' alone, and the read-ahead passes over the empty ones: acquiring the last entry
// of the run reads ahead the first ones of the next pass (wrapping past the empties), so after
// the reads settle the next pass starts from a staged entry. Clean releases keep every other
// slot free, so which reads start does not depend on I/O timing.
TEST_F(NvmeStateStoreTest, ReadAheadPassesOverEmptyEntries) {
  constexpr size_t kOwned = 4099;
  std::vector<size_t> sizes = {0, 0, 0};
  for (int e = 3; e <= 9; ++e) sizes.push_back(kOwned);
  sizes.push_back(0);
  sizes.push_back(0);
  auto store = NvmeStateStore::Create(*io_, Options(), sizes);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->file_bytes(), 7 * 2 * (*store)->array_bytes(3));
  EXPECT_EQ((*store)->array_bytes(0), 0u);
  for (int e = 3; e <= 9; ++e) {
    absl::StatusOr<StagedEntry> staged = (*store)->Acquire(e);
    ASSERT_TRUE(staged.ok()) << staged.status();
    ASSERT_TRUE((*store)->Release(e, /*dirty=*/false).ok());
  }
  ASSERT_TRUE((*store)->Flush().ok());
  const uint64_t hits = (*store)->stats().staging_hits;
  const uint64_t read = (*store)->stats().bytes_read;
  for (int e : {3, 4}) {
    absl::StatusOr<StagedEntry> staged = (*store)->Acquire(e, /*read_ahead=*/0);
    ASSERT_TRUE(staged.ok()) << staged.status();
    ASSERT_TRUE((*store)->Release(e, /*dirty=*/false).ok());
  }
  EXPECT_EQ((*store)->stats().staging_hits, hits + 2) << "entries 3 and 4 were not read ahead";
  EXPECT_EQ((*store)->stats().bytes_read, read);
  // An empty entry has nothing to stage: asking for it is a caller's mistake, said plainly.
  const absl::StatusOr<StagedEntry> empty = (*store)->Acquire(0);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(empty.status().message(), HasSubstr("entry 0 of"));
  EXPECT_EQ((*store)->Prefetch(10).code(), absl::StatusCode::kFailedPrecondition);
}

// Alternate regions (the speculative update): a write to the alternate region leaves the current
// state readable as it was, even with the speculative copy still staged; Commit makes it current;
// a discarded speculation followed by a normal update and a new speculation never lets the older
// alternate copy resurface.
TEST_F(NvmeStateStoreTest, AlternateRegionsKeepTheCurrentStateUntilCommit) {
  NvmeStateStoreOptions o = Options();
  o.alternate_regions = true;
  const std::vector<size_t> sizes = {1000, 3000, 17, 2048};
  auto store = NvmeStateStore::Create(*io_, o, sizes);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE(RunAndCompare(**store, sizes, 2).ok());  // ram_m_/ram_v_: the current state
  const uint64_t plain_bytes = [&] {
    NvmeStateStoreOptions p = Options();
    p.file_name = "plain.bin";
    auto plain = NvmeStateStore::Create(*io_, p, sizes);
    return plain.ok() ? (*plain)->file_bytes() : 0;
  }();
  EXPECT_EQ((*store)->file_bytes(), 2 * plain_bytes);
  auto speculate = [&](int e, int pass) -> absl::Status {
    absl::StatusOr<StagedEntry> staged = (*store)->Acquire(e);
    if (!staged.ok()) return staged.status();
    Update(pass, e, sizes[e], staged->array(0), staged->array(1));
    return (*store)->ReleaseToAlternate(e);
  };
  // Discarded: entry 1 speculated, never committed; the current state is untouched.
  ASSERT_TRUE(speculate(1, 7).ok());
  ExpectStoreEqualsRam(**store, sizes);
  ASSERT_TRUE((*store)->Flush().ok());
  ExpectStoreEqualsRam(**store, sizes);
  // A normal pass, then speculation of every entry, committed for 0 and 1 only.
  ASSERT_TRUE(RunAndCompare(**store, sizes, 1, /*first_pass=*/2).ok());
  for (int e = 0; e < 4; ++e) ASSERT_TRUE(speculate(e, 3).ok());
  for (int e = 0; e < 2; ++e) {
    (*store)->Commit(e);
    Update(3, e, sizes[e], ram_m_[e].data(), ram_v_[e].data());
  }
  EXPECT_EQ((*store)->current_region(0), 1);
  EXPECT_EQ((*store)->current_region(2), 0);
  ExpectStoreEqualsRam(**store, sizes);
  // Further normal passes write the committed entries' new region.
  ASSERT_TRUE(RunAndCompare(**store, sizes, 2, /*first_pass=*/4).ok());
  ExpectStoreEqualsRam(**store, sizes);
  // Without alternate regions, ReleaseToAlternate is refused.
  auto plain = NvmeStateStore::Create(*io_, [&] {
    NvmeStateStoreOptions p = Options();
    p.file_name = "plain.bin";
    return p;
  }(), sizes);
  ASSERT_TRUE(plain.ok());
  ASSERT_TRUE((*plain)->Acquire(0).ok());
  EXPECT_THAT((*plain)->ReleaseToAlternate(0).message(), HasSubstr("without alternate regions"));
}

TEST_F(NvmeStateStoreTest, ReopenedFileResumesBitwise) {
  const std::vector<size_t> sizes = {5, 40000, 1031, 77777, 3};
  {
    auto store = NvmeStateStore::Create(*io_, Options(), sizes);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE(RunAndCompare(**store, sizes, 2).ok());
  }
  auto reopened =
      NvmeStateStore::Create(*io_, Options(), sizes, NvmeStateStore::Init::kOpenExisting);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  ExpectStoreEqualsRam(**reopened, sizes);
  ASSERT_TRUE(RunAndCompare(**reopened, sizes, 2, /*first_pass=*/2).ok());
  ExpectStoreEqualsRam(**reopened, sizes);
}

TEST_F(NvmeStateStoreTest, TruncatedStateFileIsRefusedNamingFileAndOffset) {
  const std::vector<size_t> sizes = {1000, 2000};
  std::string path;
  {
    auto store = NvmeStateStore::Create(*io_, Options(), sizes);
    ASSERT_TRUE(store.ok()) << store.status();
    path = (*store)->path();
  }
  ASSERT_EQ(::truncate(path.c_str(), 8192), 0);
  auto reopened =
      NvmeStateStore::Create(*io_, Options(), sizes, NvmeStateStore::Init::kOpenExisting);
  ASSERT_EQ(reopened.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(reopened.status().message(),
              AllOf(HasSubstr(path), HasSubstr("truncated"), HasSubstr("offset 8192")));
}

TEST_F(NvmeStateStoreTest, InjectedWriteFaultMidSequenceFailsWithFileAndOffsetAndSticks) {
  FaultInjectingBlockIo faulty(*io_);
  std::vector<size_t> sizes(9, 10000);  // 40000 B arrays: 10 blocks, 2 arrays, 3-block requests
  auto store = NvmeStateStore::Create(faulty, Options(), sizes);
  ASSERT_TRUE(store.ok()) << store.status();
  faulty.FailNthOf(IoOp::kWrite, 31, InjectedFault::kEnospc);  // entry 4's 3rd request
  const absl::Status s = RunAndCompare(**store, sizes, 1);
  ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  const uint64_t entry4 = 4 * 2 * 40960;
  EXPECT_THAT(s.message(), AllOf(HasSubstr((*store)->path()),
                                 HasSubstr(absl::StrCat("offset ", entry4 + 2 * 12288)),
                                 HasSubstr("disk full")));
  EXPECT_EQ((*store)->Acquire(0).status(), s) << "the first error is sticky";
  EXPECT_EQ((*store)->Flush(), s);
}

TEST_F(NvmeStateStoreTest, InjectedReadFaultsSurfaceFromAcquire) {
  for (InjectedFault fault : {InjectedFault::kEio, InjectedFault::kTruncate}) {
    FaultInjectingBlockIo faulty(*io_);
    std::vector<size_t> sizes(6, 3000);
    auto store = NvmeStateStore::Create(faulty, Options(), sizes);
    ASSERT_TRUE(store.ok()) << store.status();
    faulty.FailNthOf(IoOp::kRead, 12, fault);
    const absl::Status s = RunAndCompare(**store, sizes, 1);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_THAT(s.message(), AllOf(HasSubstr((*store)->path()), HasSubstr("offset ")));
  }
}

TEST_F(NvmeStateStoreTest, MisuseIsReported) {
  auto store = NvmeStateStore::Create(*io_, Options(), {100, 100, 100, 100, 100});
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->Acquire(5).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT((*store)->Release(0).message(), HasSubstr("not acquired"));
  for (int e = 0; e < 4; ++e) ASSERT_TRUE((*store)->Acquire(e).ok());
  EXPECT_THAT((*store)->Acquire(0).status().message(), HasSubstr("already acquired"));
  EXPECT_THAT((*store)->Acquire(4).status().message(), HasSubstr("staging slots is acquired"));
  for (int e = 0; e < 4; ++e) ASSERT_TRUE((*store)->Release(e).ok());
  EXPECT_TRUE((*store)->Flush().ok());
}

TEST(NvmeStateStoreDirectory, RefusesTmpfs) {
  absl::StatusOr<std::unique_ptr<UringBlockIo>> io = UringBlockIo::Create();
  if (!io.ok()) GTEST_SKIP() << io.status();
  NvmeStateStoreOptions o;
  o.dir = "/dev/shm";
  EXPECT_THAT(NvmeStateStore::Create(**io, o, {10}).status().message(), HasSubstr("tmpfs"));
}

}  // namespace
}  // namespace megatrain::engine::tiers
