// Run under mpirun by mpi_communicator_test.sh: every collective of MpiCommunicator against what
// each rank computes alone from every rank's (deterministic) inputs, bit for bit. Exits 0 when all
// hold, 1 naming the first that does not.
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/dist/mpi_communicator.h"

namespace megatrain::engine::dist {
namespace {

// Rank r's contribution: large values of alternating sign beside small ones, so any other
// summation order than rank order changes the bits.
std::vector<float> Contribution(int rank, size_t n) {
  std::vector<float> v(n);
  uint64_t state = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(rank + 1);
  for (size_t i = 0; i < n; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const float small = static_cast<float>((state >> 40) % 1000) / 997.0f;
    v[i] =
        (i + static_cast<size_t>(rank)) % 3 == 0 ? (rank % 2 == 0 ? 1e7f : -1e7f) + small : small;
  }
  return v;
}

absl::Status CheckReduce(MpiCommunicator& c, size_t n) {
  std::vector<float> data = Contribution(c.rank(), n);
  if (absl::Status s = c.ReduceFloatsInRankOrder(data.data(), n); !s.ok()) return s;
  std::vector<float> expected = Contribution(0, n);
  for (int r = 1; r < c.size(); ++r) {
    const std::vector<float> add = Contribution(r, n);
    for (size_t i = 0; i < n; ++i) expected[i] += add[i];
  }
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(&data[i], &expected[i], sizeof(float)) != 0) {
      return absl::InternalError(absl::StrCat("rank ", c.rank(), ": reduce of n=", n,
                                              " differs at ", i, ": ", data[i], " vs ",
                                              expected[i]));
    }
  }
  return absl::OkStatus();
}

// ReduceFloatsInRankOrderTo: root gets the rank-ordered sum, every other rank keeps its input.
absl::Status CheckReduceTo(MpiCommunicator& c, size_t n, int root) {
  std::vector<float> data = Contribution(c.rank(), n);
  if (absl::Status s = c.ReduceFloatsInRankOrderTo(data.data(), n, root); !s.ok()) return s;
  std::vector<float> expected = Contribution(0, n);
  if (c.rank() == root) {
    for (int r = 1; r < c.size(); ++r) {
      const std::vector<float> add = Contribution(r, n);
      for (size_t i = 0; i < n; ++i) expected[i] += add[i];
    }
  } else {
    expected = Contribution(c.rank(), n);
  }
  if (std::memcmp(data.data(), expected.data(), n * sizeof(float)) != 0) {
    return absl::InternalError(
        absl::StrCat("rank ", c.rank(), ": reduce to root ", root, " of n=", n, " differs"));
  }
  return absl::OkStatus();
}

// Rank r's second contribution (kept apart, ReduceFloatPairsInRankOrder): unlike any rank's first.
std::vector<float> ApartContribution(int rank, int world, size_t n) {
  return Contribution(world + rank, n);
}

// Every rank's pair added as one process adds them: d_0, then a_0, d_1, a_1, ...
std::vector<float> PairSum(int world, size_t n) {
  std::vector<float> sum = Contribution(0, n);
  for (int r = 0; r < world; ++r) {
    if (r > 0) {
      const std::vector<float> add = Contribution(r, n);
      for (size_t i = 0; i < n; ++i) sum[i] += add[i];
    }
    const std::vector<float> apart = ApartContribution(r, world, n);
    for (size_t i = 0; i < n; ++i) sum[i] += apart[i];
  }
  return sum;
}

// ReduceFloatPairsInRankOrder (every rank gets the sum of pairs; `apart` untouched) and
// ReduceFloatPairsInRankOrderTo each root (only root gets it, the others keep their input).
absl::Status CheckReducePairs(MpiCommunicator& c, size_t n) {
  const std::vector<float> expected = PairSum(c.size(), n);
  const std::vector<float> apart = ApartContribution(c.rank(), c.size(), n);
  for (int root = -1; root < c.size(); ++root) {
    std::vector<float> data = Contribution(c.rank(), n);
    std::vector<float> apart_copy = apart;
    const absl::Status s =
        root < 0 ? c.ReduceFloatPairsInRankOrder(data.data(), apart_copy.data(), n)
                 : c.ReduceFloatPairsInRankOrderTo(data.data(), apart_copy.data(), n, root);
    if (!s.ok()) return s;
    const std::vector<float> want =
        root < 0 || root == c.rank() ? expected : Contribution(c.rank(), n);
    if (std::memcmp(data.data(), want.data(), n * sizeof(float)) != 0 ||
        std::memcmp(apart_copy.data(), apart.data(), n * sizeof(float)) != 0) {
      return absl::InternalError(absl::StrCat(
          "rank ", c.rank(), ": reduce of pairs of n=", n,
          root < 0 ? std::string(" to every rank") : absl::StrCat(" to root ", root), " differs"));
    }
  }
  return absl::OkStatus();
}

// ReduceScatterFloatsInRankOrder: rank r's shard is the rank-ordered sum of every rank's block r,
// into a buffer of its own or in place (recv = send + r * shard, the rest of send untouched).
// AllGatherFloatShards then gives every rank every reduced shard of the first n floats.
absl::Status CheckReduceScatterAndGather(MpiCommunicator& c, size_t shard, size_t n,
                                         bool in_place) {
  const size_t total = shard * static_cast<size_t>(c.size());
  std::vector<float> send = Contribution(c.rank(), total);
  const std::vector<float> before = send;
  std::vector<float> own(shard);
  float* recv = in_place ? send.data() + static_cast<size_t>(c.rank()) * shard : own.data();
  if (absl::Status s = c.ReduceScatterFloatsInRankOrder(send.data(), recv, shard); !s.ok()) {
    return s;
  }
  std::vector<float> expected = Contribution(0, total);
  for (int r = 1; r < c.size(); ++r) {
    const std::vector<float> add = Contribution(r, total);
    for (size_t i = 0; i < total; ++i) expected[i] += add[i];
  }
  const size_t mine = static_cast<size_t>(c.rank()) * shard;
  if (std::memcmp(recv, expected.data() + mine, shard * sizeof(float)) != 0) {
    return absl::InternalError(absl::StrCat("rank ", c.rank(), ": reduce-scatter of shard ", shard,
                                            in_place ? " in place" : "", " differs"));
  }
  if (in_place && (std::memcmp(send.data(), before.data(), mine * sizeof(float)) != 0 ||
                   std::memcmp(send.data() + mine + shard, before.data() + mine + shard,
                               (total - mine - shard) * sizeof(float)) != 0)) {
    return absl::InternalError(absl::StrCat("rank ", c.rank(), ": an in-place reduce-scatter of ",
                                            shard, " changed send outside its shard"));
  }
  // Every rank's slab of n <= total floats holds only its own reduced shard (and garbage
  // elsewhere); the all-gather fills in the others'.
  std::vector<float> slab(n, -1.0f);
  for (size_t i = mine; i < std::min(n, mine + shard); ++i) slab[i] = recv[i - mine];
  if (absl::Status s = c.AllGatherFloatShards(slab.data(), n); !s.ok()) return s;
  if (std::memcmp(slab.data(), expected.data(), n * sizeof(float)) != 0) {
    return absl::InternalError(
        absl::StrCat("rank ", c.rank(), ": all-gather of shards of n=", n, " differs"));
  }
  return absl::OkStatus();
}

absl::Status CheckAll(MpiCommunicator& c, int expected_size) {
  if (c.size() != expected_size) {
    return absl::InternalError(
        absl::StrCat("rank ", c.rank(), ": world size ", c.size(), ", expected ", expected_size));
  }
  absl::StatusOr<int64_t> sum = c.SumInt64(int64_t{1} << 40 | c.rank());
  if (!sum.ok()) return sum.status();
  const int64_t w = c.size();
  if (*sum != w * (int64_t{1} << 40) + w * (w - 1) / 2) {
    return absl::InternalError(absl::StrCat("rank ", c.rank(), ": SumInt64 gave ", *sum));
  }
  const double mine[2] = {static_cast<double>(c.rank()), 0.1 * c.rank()};
  absl::StatusOr<std::vector<double>> all = c.AllGatherDoubles(mine);
  if (!all.ok()) return all.status();
  for (int r = 0; r < c.size(); ++r) {
    if ((*all)[2 * r] != r || (*all)[2 * r + 1] != 0.1 * r) {
      return absl::InternalError(absl::StrCat("rank ", c.rank(), ": AllGatherDoubles slot ", r));
    }
  }
  // Odd sizes, sizes below the world (ranks owning nothing), and more than one piece.
  for (size_t n : {size_t{1}, size_t{2}, size_t{1001}, MpiCommunicator::kPieceFloats + 7}) {
    if (absl::Status s = CheckReduce(c, n); !s.ok()) return s;
  }
  for (size_t n : {size_t{1}, size_t{1001}, MpiCommunicator::kRootPieceFloats + 7}) {
    for (int root = 0; root < c.size(); ++root) {
      if (absl::Status s = CheckReduceTo(c, n, root); !s.ok()) return s;
    }
  }
  // Pairs: sizes below the world, odd, and over a piece of both reductions.
  for (size_t n : {size_t{1}, size_t{1001}, MpiCommunicator::kPieceFloats + 7}) {
    if (absl::Status s = CheckReducePairs(c, n); !s.ok()) return s;
  }
  // Shards of 1 float, odd ones, and more than one piece; slabs (whose shards are
  // ceil(n / world), the reduce-scatter's) that fill every shard, leave the last short, and leave
  // the last ranks' shards empty (n below the world).
  for (bool in_place : {false, true}) {
    const size_t w = static_cast<size_t>(c.size());
    const size_t big = MpiCommunicator::kPieceFloats / w + 5;
    for (auto [shard, n] : {std::pair{size_t{1}, size_t{1}}, std::pair{size_t{1}, w},
                            std::pair{size_t{333}, 333 * w - 1}, std::pair{big, big * w - 1}}) {
      if (absl::Status s = CheckReduceScatterAndGather(c, shard, n, in_place); !s.ok()) return s;
    }
  }
  {
    float x = 0;
    if (c.ReduceFloatPairsInRankOrderTo(&x, &x, 1, c.size()).ok()) {
      return absl::InternalError("reduce of pairs to a root outside the world succeeded");
    }
    if (c.ReduceFloatsInRankOrderTo(&x, 1, c.size()).ok()) {
      return absl::InternalError("reduce to a root outside the world succeeded");
    }
  }
  std::vector<char> bytes(3001, 0);
  const int root = c.size() - 1;
  if (c.rank() == root) {
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7);
  }
  if (absl::Status s = c.Broadcast(bytes.data(), bytes.size(), root); !s.ok()) return s;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] != static_cast<char>(i * 7)) {
      return absl::InternalError(absl::StrCat("rank ", c.rank(), ": broadcast byte ", i));
    }
  }
  if (c.Broadcast(bytes.data(), 1, c.size()).ok()) {
    return absl::InternalError("broadcast from a root outside the world succeeded");
  }
  if (c.stats().bytes_sent == 0 || c.stats().seconds <= 0) {
    return absl::InternalError(absl::StrCat("rank ", c.rank(), ": stats not counted"));
  }
  return c.Barrier();
}

}  // namespace
}  // namespace megatrain::engine::dist

int main(int argc, char** argv) {
  using megatrain::engine::dist::MpiCommunicator;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s EXPECTED_WORLD_SIZE\n", argv[0]);
    return 2;
  }
  absl::StatusOr<std::unique_ptr<MpiCommunicator>> c = MpiCommunicator::Create();
  if (!c.ok()) {
    std::fprintf(stderr, "%s\n", std::string(c.status().message()).c_str());
    return 1;
  }
  if (MpiCommunicator::Create().ok()) {
    std::fprintf(stderr, "a second MpiCommunicator was created\n");
    return 1;
  }
  // On loopback every rank shares this machine: its local rank is its world rank.
  if ((*c)->local_rank() != (*c)->rank() || (*c)->local_size() != (*c)->size()) {
    std::fprintf(stderr, "FAIL rank %d of %d: local rank %d of %d on one machine\n", (*c)->rank(),
                 (*c)->size(), (*c)->local_rank(), (*c)->local_size());
    return 1;
  }
  const absl::Status s = megatrain::engine::dist::CheckAll(**c, std::atoi(argv[1]));
  if (!s.ok()) {
    std::fprintf(stderr, "FAIL %s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::printf("rank %d of %d: all collectives exact\n", (*c)->rank(), (*c)->size());
  return 0;
}
