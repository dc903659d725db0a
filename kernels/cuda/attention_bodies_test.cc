// The CUDA attention bodies (attention_bodies.h: forward, delta, dK/dV, dQ) on the CPU under the
// block emulator, each over the launch its launcher makes (AttentionLaunchOf: grid, block and
// shared bytes), against the double reference (testing/attention_reference.h) and the CPU kernel
// (kernels/cpu/attention.h): causal, GQA, packed samples (segment ids), sequences that end inside
// a block and a tile, head_dim 64 and 128, batch > 1.
//
// Float storage carries the numerics (inputs are bf16-representable, so both storages load the
// same floats). bf16 storage, what the GPU runs, is then checked bitwise against the float run:
// the same fp32 math with only the stores rounded (the backward of the float run is fed the
// bf16-rounded out, which is what the bf16 delta reads).
//
// Tolerances, float storage against the double reference (inputs in [-1, 1], scores O(1)):
// out is a convex combination of v with a few ulp of error per score times sqrt(D): 2e-6 absolute
// + 1e-5 relative; lse sums up to seq exps: 1e-5 absolute; the gradients add up to
// seq * q_heads / kv_heads products of O(1) terms: 5e-6 absolute + 5e-5 relative (the bounds the
// CPU kernel meets in kernels/cpu/attention_test.cc); absolute terms are times the tensor's
// largest |value|, at least 1. Against the CPU kernel, both sides are within those bounds of the
// reference, so the bound is their sum. The worst error seen (2026-11-27) is 3% of its bound.
#include "kernels/cuda/attention_bodies.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <future>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/common/bf16.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/launch_geometry.h"
#include "kernels/cuda/testing/attention_reference.h"
#include "kernels/cuda/testing/block_emulator.h"
#include "kernels/cuda/testing/host_storage.h"

namespace megatrain::kernels::cuda {
namespace {

using testing::AttentionReferenceResult;
using testing::AttentionReferenceShape;
using testing::Bf16BitsStorage;
using testing::EmulatedGrid;
using testing::EmulatedThread;
using testing::FloatStorage;
using testing::ReferenceAttention;
using testing::RunEmulatedGrid;

struct Tolerance {
  double abs;  // times the largest |reference| of the tensor (at least 1)
  double rel;  // times |reference| of the element
};
constexpr Tolerance kOutTol{2e-6, 1e-5};
constexpr Tolerance kLseTol{1e-5, 0.0};
constexpr Tolerance kGradTol{5e-6, 5e-5};

Tolerance Twice(Tolerance t) { return Tolerance{2 * t.abs, 2 * t.rel}; }

struct Case {
  std::string name;
  int batch, seq, q_heads, kv_heads, head_dim;
  // Per sequence, the lengths of the samples packed into it (summing to seq); empty: no
  // segment ids.
  std::vector<std::vector<int>> samples;
  int first_id = 0;  // the id of each sequence's first sample (ids need only be non-decreasing)
};

float Scale(const Case& c) { return 1.0f / std::sqrt(static_cast<float>(c.head_dim)); }

// [batch, seq] ids: sample k of a sequence has id first_id + k.
std::vector<int32_t> SegmentIds(const Case& c) {
  std::vector<int32_t> ids;
  for (const std::vector<int>& lengths : c.samples) {
    int total = 0;
    for (size_t k = 0; k < lengths.size(); ++k) {
      ids.insert(ids.end(), static_cast<size_t>(lengths[k]),
                 static_cast<int32_t>(c.first_id + static_cast<int>(k)));
      total += lengths[k];
    }
    EXPECT_EQ(total, c.seq) << c.name << ": sample lengths must add up to seq";
  }
  return ids;
}

// Deterministic values in [-1, 1), rounded to bf16 so both storages hold them exactly.
std::vector<float> Values(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t state = seed * 2654435761u + 1u;
  for (float& x : v) {
    state = state * 1664525u + 1013904223u;
    const float u = static_cast<float>(state >> 8) / static_cast<float>(1u << 24);
    x = Bf16BitsToFloat32(Float32ToBf16Bits(2.0f * u - 1.0f));
  }
  return v;
}

struct Inputs {
  std::vector<float> q, k, v, dout;
  std::vector<int32_t> segments;  // empty: none
};

size_t QElements(const Case& c) {
  return static_cast<size_t>(c.batch) * c.seq * c.q_heads * c.head_dim;
}
size_t KvElements(const Case& c) {
  return static_cast<size_t>(c.batch) * c.seq * c.kv_heads * c.head_dim;
}
size_t StatsElements(const Case& c) { return static_cast<size_t>(c.batch) * c.q_heads * c.seq; }

Inputs MakeInputs(const Case& c, uint32_t seed) {
  return Inputs{Values(QElements(c), seed), Values(KvElements(c), seed + 1),
                Values(KvElements(c), seed + 2), Values(QElements(c), seed + 3),
                c.samples.empty() ? std::vector<int32_t>{} : SegmentIds(c)};
}

// What the bodies wrote, widened to float.
struct ForwardResult {
  std::vector<float> out, lse;
};
struct BackwardResult {
  std::vector<float> delta, dq, dk, dv;
};

template <class S>
std::vector<typename S::T> Store(const std::vector<float>& v) {
  std::vector<typename S::T> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = S::Make(v[i]);
  return out;
}

template <class S>
std::vector<float> Widen(const std::vector<typename S::T>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = S::Load(v[i]);
  return out;
}

// Poisoned outputs, so an element no body writes shows up as NaN.
template <class S>
std::vector<typename S::T> Poisoned(size_t n) {
  return std::vector<typename S::T>(n, S::Make(NAN));
}

AttentionKernelDims DimsOf(const Case& c, const Inputs& in) {
  return AttentionKernelDims{c.batch,   c.seq,
                             c.q_heads, c.kv_heads,
                             Scale(c),  in.segments.empty() ? nullptr : in.segments.data()};
}

// Runs `body` over the launch the launcher makes for `pass`.
template <int D>
absl::Status Emulate(AttentionPass pass, const AttentionKernelDims& dims,
                     const std::function<void(const EmulatedThread&)>& body) {
  const AttentionLaunch launch = AttentionLaunchOf<D>(pass, dims);
  const absl::Status status =
      RunEmulatedGrid(EmulatedGrid{launch.shape.blocks_x, launch.shape.blocks_y,
                                   launch.shape.threads, launch.shared_bytes},
                      body);
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat("pass ", static_cast<int>(pass), ": ", status.message()));
  }
  return absl::OkStatus();
}

template <class S, int D>
absl::StatusOr<ForwardResult> ForwardAt(const Case& c, const Inputs& in) {
  const AttentionKernelDims dims = DimsOf(c, in);
  const std::vector<typename S::T> q = Store<S>(in.q), k = Store<S>(in.k), v = Store<S>(in.v);
  std::vector<typename S::T> out = Poisoned<S>(QElements(c));
  std::vector<float> lse(StatsElements(c), NAN);
  const absl::Status status =
      Emulate<D>(AttentionPass::kForward, dims, [&](const EmulatedThread& t) {
        AttentionForwardBlock<S, D>(dims, q.data(), k.data(), v.data(), out.data(), lse.data(),
                                    AttentionKeyTiles<D>::Carve(t.shared));
      });
  if (!status.ok()) return status;
  return ForwardResult{Widen<S>(out), lse};
}

// The backward passes in the launcher's order (delta, dK/dV, dQ), from the forward's out and lse.
template <class S, int D>
absl::StatusOr<BackwardResult> BackwardAt(const Case& c, const Inputs& in,
                                          const ForwardResult& fwd) {
  const AttentionKernelDims dims = DimsOf(c, in);
  const std::vector<typename S::T> q = Store<S>(in.q), k = Store<S>(in.k), v = Store<S>(in.v),
                                   dout = Store<S>(in.dout), out = Store<S>(fwd.out);
  std::vector<typename S::T> dq = Poisoned<S>(QElements(c)), dk = Poisoned<S>(KvElements(c)),
                             dv = Poisoned<S>(KvElements(c));
  std::vector<float> delta(StatsElements(c), NAN);
  absl::Status status = Emulate<D>(AttentionPass::kDelta, dims, [&](const EmulatedThread&) {
    AttentionDeltaBlock<S, D>(dims, out.data(), dout.data(), delta.data());
  });
  if (!status.ok()) return status;
  status = Emulate<D>(AttentionPass::kDkDv, dims, [&](const EmulatedThread& t) {
    AttentionDkDvBlock<S, D>(dims, q.data(), k.data(), v.data(), dout.data(), fwd.lse.data(),
                             delta.data(), dk.data(), dv.data(),
                             AttentionQueryTiles<D>::Carve(t.shared));
  });
  if (!status.ok()) return status;
  status = Emulate<D>(AttentionPass::kDq, dims, [&](const EmulatedThread& t) {
    AttentionDqBlock<S, D>(dims, q.data(), k.data(), v.data(), dout.data(), fwd.lse.data(),
                           delta.data(), dq.data(), AttentionKeyTiles<D>::Carve(t.shared));
  });
  if (!status.ok()) return status;
  return BackwardResult{delta, Widen<S>(dq), Widen<S>(dk), Widen<S>(dv)};
}

// The head_dim dispatch of the launchers (attention.cu): 64 and 128.
template <class S>
absl::StatusOr<ForwardResult> Forward(const Case& c, const Inputs& in) {
  switch (c.head_dim) {
    case 64:
      return ForwardAt<S, 64>(c, in);
    case 128:
      return ForwardAt<S, 128>(c, in);
  }
  return absl::InvalidArgumentError(absl::StrCat("head_dim = ", c.head_dim));
}

template <class S>
absl::StatusOr<BackwardResult> Backward(const Case& c, const Inputs& in, const ForwardResult& fwd) {
  switch (c.head_dim) {
    case 64:
      return BackwardAt<S, 64>(c, in, fwd);
    case 128:
      return BackwardAt<S, 128>(c, in, fwd);
  }
  return absl::InvalidArgumentError(absl::StrCat("head_dim = ", c.head_dim));
}

// Every element within tol.abs * max(1, max|want|) + tol.rel * |want|; reports the worst one.
template <class Want>
void ExpectClose(const std::vector<float>& got, const std::vector<Want>& want, Tolerance tol,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  // At least 1: the inputs are O(1), so rounding errors are too even where a result cancels
  // to ~0 (seq 1: dq = dk = 0 exactly in exact arithmetic).
  double scale = 1.0;
  for (const Want w : want) scale = std::max(scale, std::fabs(static_cast<double>(w)));
  double worst_ratio = 0.0;
  size_t worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double w = static_cast<double>(want[i]);
    const double bound = tol.abs * scale + tol.rel * std::fabs(w);
    const double error = std::fabs(static_cast<double>(got[i]) - w);
    const double ratio = std::isnan(error) ? INFINITY : error / bound;
    if (ratio > worst_ratio) worst_ratio = ratio, worst = i;
  }
  EXPECT_LE(worst_ratio, 1.0) << what << ": element " << worst << " got " << got[worst] << " want "
                              << static_cast<double>(want[worst]) << " (error " << worst_ratio
                              << " x the bound; largest |want| " << scale << ")";
}

// Bitwise equality of two float tensors (NaN patterns included).
void ExpectBitwise(const std::vector<float>& got, const std::vector<float>& want,
                   const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(FloatBits(got[i]), FloatBits(want[i]))
        << what << " element " << i << ": got " << got[i] << " want " << want[i];
  }
}

std::vector<float> RoundedToBf16(const std::vector<float>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = Bf16BitsToFloat32(Float32ToBf16Bits(v[i]));
  return out;
}

AttentionReferenceResult Reference(const Case& c, const Inputs& in) {
  return ReferenceAttention(
      AttentionReferenceShape{c.batch, c.seq, c.q_heads, c.kv_heads, c.head_dim, Scale(c)}, in.q,
      in.k, in.v, in.dout, in.segments);
}

struct CpuResult {
  std::vector<float> out, lse, dq, dk, dv;
};

CpuResult RunCpuKernel(const Case& c, const Inputs& in) {
  const cpu::AttentionShape shape{c.batch, c.seq, c.q_heads, c.kv_heads, c.head_dim, Scale(c)};
  const cpu::AttentionTiles tiles;
  const int32_t* segments = in.segments.empty() ? nullptr : in.segments.data();
  CpuResult r;
  r.out.assign(QElements(c), NAN);
  r.lse.assign(StatsElements(c), NAN);
  r.dq.assign(QElements(c), NAN);
  r.dk.assign(KvElements(c), NAN);
  r.dv.assign(KvElements(c), NAN);
  cpu::AttentionForward(shape, tiles, in.q.data(), in.k.data(), in.v.data(), r.out.data(),
                        r.lse.data(), nullptr, segments);
  cpu::AttentionBackward(shape, tiles, in.q.data(), in.k.data(), in.v.data(), r.out.data(),
                         r.lse.data(), in.dout.data(), r.dq.data(), r.dk.data(), r.dv.data(),
                         nullptr, segments);
  return r;
}

// Sequences of 1, 37, 50, 64, 67 and 70 tokens: a lone token, ends inside a 16-row block and a
// 32-key tile, ends on a tile boundary, two and three key tiles; group sizes 1 (plain multi-head),
// 2 and 3, kv_heads 1 and 2. Packed rows put sample starts inside blocks, on a block boundary
// (16), on a tile boundary (32), hold one-token samples, and start their ids at 0 or at -1 (the
// value the bodies use for slots past the sequence end).
const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      {"one_token", 2, 1, 2, 1, 64, {}},
      {"gqa2_d64", 2, 37, 4, 2, 64, {}},
      {"gqa3_d128", 1, 70, 3, 1, 128, {}},
      {"mha_d64_seq64", 1, 64, 2, 2, 64, {}},
      {"packed_gqa2_d64", 2, 67, 4, 2, 64, {{20, 1, 30, 16}, {16, 16, 35}}},
      {"packed_gqa2_d128_ids_from_minus1", 2, 50, 2, 1, 128, {{32, 1, 17}, {7, 43}}, -1},
  };
  return cases;
}

// Every body run of one case, independent runs concurrently (an emulated grid mostly waits on
// its barriers, so two grids share the host's cores well).
struct Runs {
  ForwardResult fwd32, fwd16;
  BackwardResult bwd32;          // float, from fwd32
  BackwardResult bwd16;          // bf16, from fwd16
  BackwardResult bwd32_from_16;  // float, from fwd16's (bf16-rounded) out and lse
};

template <class T>
T Get(std::future<absl::StatusOr<T>>& future, const std::string& what) {
  absl::StatusOr<T> result = future.get();
  EXPECT_TRUE(result.ok()) << what << ": " << result.status();
  return result.ok() ? *std::move(result) : T{};
}

Runs RunAll(const Case& c, const Inputs& in) {
  Runs runs;
  auto fwd32 = std::async(std::launch::async, [&] { return Forward<FloatStorage>(c, in); });
  auto fwd16 = std::async(std::launch::async, [&] { return Forward<Bf16BitsStorage>(c, in); });
  runs.fwd32 = Get(fwd32, "float forward");
  runs.fwd16 = Get(fwd16, "bf16 forward");
  auto bwd32 =
      std::async(std::launch::async, [&] { return Backward<FloatStorage>(c, in, runs.fwd32); });
  auto bwd16 =
      std::async(std::launch::async, [&] { return Backward<Bf16BitsStorage>(c, in, runs.fwd16); });
  auto bwd32_from_16 =
      std::async(std::launch::async, [&] { return Backward<FloatStorage>(c, in, runs.fwd16); });
  runs.bwd32 = Get(bwd32, "float backward");
  runs.bwd16 = Get(bwd16, "bf16 backward");
  runs.bwd32_from_16 = Get(bwd32_from_16, "float backward from the bf16 forward");
  return runs;
}

class AttentionBodiesTest : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionBodiesTest, MatchReferenceAndCpuKernelAndRoundOnlyOnStoreInBf16) {
  const Case& c = GetParam();
  const Inputs in = MakeInputs(c, 11);
  const Runs runs = RunAll(c, in);
  if (HasFailure()) return;

  // Float storage: the numerics.
  const AttentionReferenceResult ref = Reference(c, in);
  ExpectClose(runs.fwd32.out, ref.out, kOutTol, c.name + " out vs reference");
  ExpectClose(runs.fwd32.lse, ref.lse, kLseTol, c.name + " lse vs reference");
  ExpectClose(runs.bwd32.dq, ref.dq, kGradTol, c.name + " dq vs reference");
  ExpectClose(runs.bwd32.dk, ref.dk, kGradTol, c.name + " dk vs reference");
  ExpectClose(runs.bwd32.dv, ref.dv, kGradTol, c.name + " dv vs reference");
  const CpuResult cpu = RunCpuKernel(c, in);
  ExpectClose(runs.fwd32.out, cpu.out, Twice(kOutTol), c.name + " out vs CPU kernel");
  ExpectClose(runs.fwd32.lse, cpu.lse, Twice(kLseTol), c.name + " lse vs CPU kernel");
  ExpectClose(runs.bwd32.dq, cpu.dq, Twice(kGradTol), c.name + " dq vs CPU kernel");
  ExpectClose(runs.bwd32.dk, cpu.dk, Twice(kGradTol), c.name + " dk vs CPU kernel");
  ExpectClose(runs.bwd32.dv, cpu.dv, Twice(kGradTol), c.name + " dv vs CPU kernel");

  // bf16 storage: the float run's math, rounded on store.
  ExpectBitwise(runs.fwd16.out, RoundedToBf16(runs.fwd32.out), c.name + " bf16 out");
  ExpectBitwise(runs.fwd16.lse, runs.fwd32.lse, c.name + " bf16 lse");
  ExpectBitwise(runs.bwd16.delta, runs.bwd32_from_16.delta, c.name + " bf16 delta");
  ExpectBitwise(runs.bwd16.dq, RoundedToBf16(runs.bwd32_from_16.dq), c.name + " bf16 dq");
  ExpectBitwise(runs.bwd16.dk, RoundedToBf16(runs.bwd32_from_16.dk), c.name + " bf16 dk");
  ExpectBitwise(runs.bwd16.dv, RoundedToBf16(runs.bwd32_from_16.dv), c.name + " bf16 dv");
}

// Float forward and backward of one case (the runs the segment tests compare bitwise).
struct FloatRun {
  ForwardResult fwd;
  BackwardResult bwd;
};

FloatRun RunFloat(const Case& c, const Inputs& in) {
  absl::StatusOr<ForwardResult> fwd = Forward<FloatStorage>(c, in);
  EXPECT_TRUE(fwd.ok()) << fwd.status();
  if (!fwd.ok()) return {};
  absl::StatusOr<BackwardResult> bwd = Backward<FloatStorage>(c, in, *fwd);
  EXPECT_TRUE(bwd.ok()) << bwd.status();
  if (!bwd.ok()) return {};
  return FloatRun{*std::move(fwd), *std::move(bwd)};
}

// Packed samples never see each other: new values for every token of the odd-numbered samples
// leave every result of the even-numbered samples' tokens bitwise unchanged.
class AttentionBodiesPackedTest : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionBodiesPackedTest, OtherSamplesNeverChangeASamplesResults) {
  const Case& c = GetParam();
  const Inputs in = MakeInputs(c, 31);
  Inputs changed = in;
  const Inputs other = MakeInputs(c, 97);
  const size_t q_row = static_cast<size_t>(c.q_heads) * c.head_dim;
  const size_t kv_row = static_cast<size_t>(c.kv_heads) * c.head_dim;
  auto odd = [&](size_t token) { return (in.segments[token] & 1) != 0; };
  const size_t tokens = static_cast<size_t>(c.batch) * c.seq;
  for (size_t t = 0; t < tokens; ++t) {
    if (!odd(t)) continue;
    for (size_t i = t * q_row; i < (t + 1) * q_row; ++i) {
      changed.q[i] = other.q[i];
      changed.dout[i] = other.dout[i];
    }
    for (size_t i = t * kv_row; i < (t + 1) * kv_row; ++i) {
      changed.k[i] = other.k[i];
      changed.v[i] = other.v[i];
    }
  }
  FloatRun a, b;
  auto run_b = std::async(std::launch::async, [&] { b = RunFloat(c, changed); });
  a = RunFloat(c, in);
  run_b.get();
  if (HasFailure()) return;
  int differing_odd = 0;
  for (size_t t = 0; t < tokens; ++t) {
    const size_t batch = t / static_cast<size_t>(c.seq), s = t % static_cast<size_t>(c.seq);
    auto same = [&](const std::vector<float>& x, const std::vector<float>& y, size_t first,
                    size_t n) {
      for (size_t i = first; i < first + n; ++i) {
        if (FloatBits(x[i]) != FloatBits(y[i])) return false;
      }
      return true;
    };
    bool unchanged = same(a.fwd.out, b.fwd.out, t * q_row, q_row) &&
                     same(a.bwd.dq, b.bwd.dq, t * q_row, q_row) &&
                     same(a.bwd.dk, b.bwd.dk, t * kv_row, kv_row) &&
                     same(a.bwd.dv, b.bwd.dv, t * kv_row, kv_row);
    for (int h = 0; h < c.q_heads; ++h) {
      const size_t stat = (batch * static_cast<size_t>(c.q_heads) + static_cast<size_t>(h)) *
                              static_cast<size_t>(c.seq) +
                          s;
      unchanged = unchanged && same(a.fwd.lse, b.fwd.lse, stat, 1) &&
                  same(a.bwd.delta, b.bwd.delta, stat, 1);
    }
    if (odd(t)) {
      differing_odd += unchanged ? 0 : 1;
    } else {
      EXPECT_TRUE(unchanged) << c.name << ": token " << s << " of sequence " << batch
                             << " (segment " << in.segments[t]
                             << ") changed with other samples' values";
    }
  }
  EXPECT_GT(differing_odd, 0) << "the perturbation changed nothing";
}

// With one segment per sequence the segment rules reduce to the causal ones bit for bit.
TEST(AttentionBodiesSegmentsTest, OneSegmentPerSequenceIsBitwiseNoSegments) {
  const Case plain{"gqa2_d64", 2, 37, 4, 2, 64, {}};
  Case one_segment = plain;
  one_segment.samples = {{37}, {37}};
  const Inputs in = MakeInputs(plain, 41);
  Inputs with_ids = in;
  with_ids.segments = SegmentIds(one_segment);
  FloatRun a, b;
  auto run_b = std::async(std::launch::async, [&] { b = RunFloat(one_segment, with_ids); });
  a = RunFloat(plain, in);
  run_b.get();
  if (HasFailure()) return;
  ExpectBitwise(b.fwd.out, a.fwd.out, "out");
  ExpectBitwise(b.fwd.lse, a.fwd.lse, "lse");
  ExpectBitwise(b.bwd.dq, a.bwd.dq, "dq");
  ExpectBitwise(b.bwd.dk, a.bwd.dk, "dk");
  ExpectBitwise(b.bwd.dv, a.bwd.dv, "dv");
}

std::vector<Case> PackedCases() {
  std::vector<Case> packed;
  for (const Case& c : Cases()) {
    if (!c.samples.empty()) packed.push_back(c);
  }
  return packed;
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionBodiesPackedTest, ::testing::ValuesIn(PackedCases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionBodiesTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace megatrain::kernels::cuda
