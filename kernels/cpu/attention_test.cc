// Tests for tiled causal GQA attention (forward and backward) against a naive
// double reference, with finite-difference checks of the reference itself.
#include "kernels/cpu/attention.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/test_util.h"

namespace megatrain::kernels::cpu {
namespace {

using testing::AllClose;
using testing::RandomFloats;
using testing::ToDouble;

// Tolerances (fp32 kernel vs double reference, inputs in [-1, 1]):
// out is a convex combination of v; scores and softmax are O(1) with errors
// of a few ulp times sqrt(D): 2e-6 abs + 1e-5 rel. lse sums up to S exps:
// 1e-5 abs. Gradients add up S * Hq/Hkv tile products of O(1) terms:
// 5e-6 abs + 5e-5 rel (observed
// worst 5e-7).
constexpr double kOutAbs = 2e-6, kOutRel = 1e-5;
constexpr double kLseAbs = 1e-5;
constexpr double kGradAbs = 5e-6, kGradRel = 5e-5;

struct Inputs {
  AttentionShape shape;
  std::vector<float> q, k, v, dout;
};

Inputs MakeInputs(int64_t batch, int64_t seq, int64_t hq, int64_t hkv, int64_t d, int64_t window,
                  uint32_t seed) {
  Inputs in;
  in.shape = AttentionShape{batch, seq, hq, hkv, d, static_cast<float>(1.0 / std::sqrt(d)), window};
  // Scores up to ~3*sqrt(D) * scale: sharp enough to test the online max.
  in.q = RandomFloats(batch * seq * hq * d, seed, -3.0f, 3.0f);
  in.k = RandomFloats(batch * seq * hkv * d, seed + 1, -1.0f, 1.0f);
  in.v = RandomFloats(batch * seq * hkv * d, seed + 2);
  in.dout = RandomFloats(batch * seq * hq * d, seed + 3);
  return in;
}

bool VisibleRef(int64_t i, int64_t j, int64_t window) {
  return j <= i && (window == 0 || i - j < window);
}

// With segment ids [B, S] (empty = one segment per sequence): also the same segment.
bool VisibleRef(const std::vector<int32_t>& segments, int64_t b, int64_t seq, int64_t i, int64_t j,
                int64_t window) {
  return VisibleRef(i, j, window) &&
         (segments.empty() || segments[b * seq + i] == segments[b * seq + j]);
}

struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

// Naive attention in double: full score rows, then backward by the chain rule.
Reference RunReference(const AttentionShape& s, const std::vector<double>& q,
                       const std::vector<double>& k, const std::vector<double>& v,
                       const std::vector<double>& dout,
                       const std::vector<int32_t>& segments = {}) {
  const int64_t B = s.batch, S = s.seq, Hq = s.q_heads, Hkv = s.kv_heads, D = s.head_dim;
  Reference ref;
  ref.out.assign(B * S * Hq * D, 0.0);
  ref.lse.assign(B * Hq * S, 0.0);
  ref.dq.assign(q.size(), 0.0);
  ref.dk.assign(k.size(), 0.0);
  ref.dv.assign(v.size(), 0.0);
  const double scale = s.scale;
  auto qi = [&](int64_t b, int64_t i, int64_t h) { return ((b * S + i) * Hq + h) * D; };
  auto ki = [&](int64_t b, int64_t j, int64_t g) { return ((b * S + j) * Hkv + g) * D; };
  std::vector<double> p(S), dp(S);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t g = h / (Hq / Hkv);
      for (int64_t i = 0; i < S; ++i) {
        auto visible = [&](int64_t j) { return VisibleRef(segments, b, S, i, j, s.window); };
        double max = -INFINITY;
        for (int64_t j = 0; j < S; ++j) {
          p[j] = -INFINITY;
          if (!visible(j)) continue;
          double dot = 0.0;
          for (int64_t c = 0; c < D; ++c) dot += q[qi(b, i, h) + c] * k[ki(b, j, g) + c];
          p[j] = dot * scale;
          max = std::max(max, p[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < S; ++j)
          sum += visible(j) ? std::exp(p[j] - max) : 0;
        ref.lse[(b * Hq + h) * S + i] = max + std::log(sum);
        for (int64_t j = 0; j < S; ++j) {
          p[j] = visible(j) ? std::exp(p[j] - max) / sum : 0.0;
          for (int64_t c = 0; c < D; ++c) ref.out[qi(b, i, h) + c] += p[j] * v[ki(b, j, g) + c];
        }
        // Backward of this row.
        double row_d = 0.0;
        for (int64_t j = 0; j < S; ++j) {
          dp[j] = 0.0;
          for (int64_t c = 0; c < D; ++c) dp[j] += dout[qi(b, i, h) + c] * v[ki(b, j, g) + c];
          row_d += p[j] * dp[j];
        }
        for (int64_t j = 0; j < S; ++j) {
          const double ds = p[j] * (dp[j] - row_d) * scale;
          for (int64_t c = 0; c < D; ++c) {
            ref.dv[ki(b, j, g) + c] += p[j] * dout[qi(b, i, h) + c];
            ref.dq[qi(b, i, h) + c] += ds * k[ki(b, j, g) + c];
            ref.dk[ki(b, j, g) + c] += ds * q[qi(b, i, h) + c];
          }
        }
      }
    }
  }
  return ref;
}

struct Result {
  std::vector<float> out, lse, dq, dk, dv;
};

Result RunKernel(const Inputs& in, const AttentionTiles& tiles, bool caller_workspace,
                 const std::vector<int32_t>& segments = {}) {
  const int32_t* seg = segments.empty() ? nullptr : segments.data();
  const AttentionShape& s = in.shape;
  Result r;
  r.out.assign(in.q.size(), NAN);
  r.lse.assign(s.batch * s.q_heads * s.seq, NAN);
  r.dq.assign(in.q.size(), NAN);  // NaN proves the backward overwrites
  r.dk.assign(in.k.size(), NAN);
  r.dv.assign(in.v.size(), NAN);
  std::vector<float> fwd_ws, bwd_ws;
  if (caller_workspace) {
    fwd_ws.assign(AttentionForwardWorkspaceFloats(s, tiles), NAN);
    bwd_ws.assign(AttentionBackwardWorkspaceFloats(s, tiles), NAN);
  }
  AttentionForward(s, tiles, in.q.data(), in.k.data(), in.v.data(), r.out.data(), r.lse.data(),
                   caller_workspace ? fwd_ws.data() : nullptr, seg);
  AttentionBackward(s, tiles, in.q.data(), in.k.data(), in.v.data(), r.out.data(), r.lse.data(),
                    in.dout.data(), r.dq.data(), r.dk.data(), r.dv.data(),
                    caller_workspace ? bwd_ws.data() : nullptr, seg);
  return r;
}

void ExpectMatchesReference(const Result& r, const Reference& ref) {
  EXPECT_TRUE(AllClose(r.out, ref.out, kOutAbs, kOutRel)) << "out";
  EXPECT_TRUE(AllClose(r.lse, ref.lse, kLseAbs, 0.0)) << "lse";
  EXPECT_TRUE(AllClose(r.dq, ref.dq, kGradAbs, kGradRel)) << "dq";
  EXPECT_TRUE(AllClose(r.dk, ref.dk, kGradAbs, kGradRel)) << "dk";
  EXPECT_TRUE(AllClose(r.dv, ref.dv, kGradAbs, kGradRel)) << "dv";
}

struct Case {
  int64_t window;
  int64_t q_tile;
  int64_t k_tile;
};

class AttentionCaseTest : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionCaseTest, MatchesDoubleReference) {
  const Case c = GetParam();
  const Inputs in = MakeInputs(2, 29, 6, 2, 10, c.window, 100);
  const Reference ref =
      RunReference(in.shape, ToDouble(in.q), ToDouble(in.k), ToDouble(in.v), ToDouble(in.dout));
  ExpectMatchesReference(RunKernel(in, AttentionTiles{c.q_tile, c.k_tile}, true), ref);
}

// Windows: none, 1 (only the diagonal), 5 (crosses tiles), 29 (== S), 40 (> S).
// Tiles: 16x16 (S=29 leaves a ragged last tile), unequal 16x8 and 7x5, and one
// tile covering everything.
INSTANTIATE_TEST_SUITE_P(Shapes, AttentionCaseTest,
                         ::testing::Values(Case{0, 16, 16}, Case{0, 16, 8}, Case{0, 7, 5},
                                           Case{0, 64, 64}, Case{1, 16, 16}, Case{5, 16, 16},
                                           Case{5, 7, 5}, Case{29, 16, 16}, Case{40, 8, 16}));

TEST(AttentionTest, MultiQuerySingleKvHead) {
  const Inputs in = MakeInputs(1, 23, 4, 1, 12, 0, 200);
  const Reference ref =
      RunReference(in.shape, ToDouble(in.q), ToDouble(in.k), ToDouble(in.v), ToDouble(in.dout));
  ExpectMatchesReference(RunKernel(in, AttentionTiles{8, 8}, false), ref);
}

TEST(AttentionTest, DeterministicAndWorkspaceIndependent) {
  const Inputs in = MakeInputs(2, 29, 6, 2, 10, 7, 300);
  const AttentionTiles tiles{16, 16};
  const Result a = RunKernel(in, tiles, true);
  const Result b = RunKernel(in, tiles, false);
  EXPECT_TRUE(testing::BitwiseEqual(a.out, b.out));
  EXPECT_TRUE(testing::BitwiseEqual(a.lse, b.lse));
  EXPECT_TRUE(testing::BitwiseEqual(a.dq, b.dq));
  EXPECT_TRUE(testing::BitwiseEqual(a.dk, b.dk));
  EXPECT_TRUE(testing::BitwiseEqual(a.dv, b.dv));
}

TEST(AttentionTest, DifferentTilingsAgreeWithinTolerance) {
  const Inputs in = MakeInputs(1, 29, 6, 2, 10, 0, 400);
  const Result a = RunKernel(in, AttentionTiles{16, 16}, true);
  const Result b = RunKernel(in, AttentionTiles{5, 11}, true);
  EXPECT_TRUE(AllClose(b.out, ToDouble(a.out), 2 * kOutAbs, 2 * kOutRel));
  EXPECT_TRUE(AllClose(b.lse, ToDouble(a.lse), 2 * kLseAbs, 0.0));
  EXPECT_TRUE(AllClose(b.dq, ToDouble(a.dq), 2 * kGradAbs, 2 * kGradRel));
  EXPECT_TRUE(AllClose(b.dk, ToDouble(a.dk), 2 * kGradAbs, 2 * kGradRel));
  EXPECT_TRUE(AllClose(b.dv, ToDouble(a.dv), 2 * kGradAbs, 2 * kGradRel));
}

// The reference's analytic backward against central differences of its own
// forward, objective sum(out * dout), on a small GQA shape with a window.
TEST(AttentionTest, ReferenceBackwardMatchesFiniteDifference) {
  const Inputs in = MakeInputs(1, 9, 4, 2, 4, 4, 500);
  std::vector<double> q = ToDouble(in.q), k = ToDouble(in.k), v = ToDouble(in.v);
  const std::vector<double> dout = ToDouble(in.dout);
  const Reference ref = RunReference(in.shape, q, k, v, dout);
  auto objective = [&]() {
    const Reference r = RunReference(in.shape, q, k, v, dout);
    double sum = 0.0;
    for (size_t i = 0; i < r.out.size(); ++i) sum += r.out[i] * dout[i];
    return sum;
  };
  const double step = 1e-5;  // truncation ~1e-10 for O(1) curvature
  auto check = [&](std::vector<double>& x, const std::vector<double>& grad, const char* name) {
    for (size_t i = 0; i < x.size(); i += 3) {
      const double saved = x[i];
      x[i] = saved + step;
      const double plus = objective();
      x[i] = saved - step;
      const double minus = objective();
      x[i] = saved;
      EXPECT_NEAR(grad[i], (plus - minus) / (2 * step), 1e-7) << name << "[" << i << "]";
    }
  };
  check(q, ref.dq, "dq");
  check(k, ref.dk, "dk");
  check(v, ref.dv, "dv");
}

// Segment ids (packed samples). Row 0: samples of 7, 13 and 9 tokens; row 1: 20, 1, 8 tokens.
std::vector<int32_t> SegmentsOf(const std::vector<std::vector<int64_t>>& rows) {
  std::vector<int32_t> out;
  for (const std::vector<int64_t>& lengths : rows) {
    for (size_t k = 0; k < lengths.size(); ++k) out.insert(out.end(), lengths[k], int32_t(k));
  }
  return out;
}

TEST_P(AttentionCaseTest, SegmentIdsMatchDoubleReference) {
  const Case c = GetParam();
  const Inputs in = MakeInputs(2, 29, 6, 2, 10, c.window, 150);
  const std::vector<int32_t> segments = SegmentsOf({{7, 13, 9}, {20, 1, 8}});
  const Reference ref = RunReference(in.shape, ToDouble(in.q), ToDouble(in.k), ToDouble(in.v),
                                     ToDouble(in.dout), segments);
  ExpectMatchesReference(RunKernel(in, AttentionTiles{c.q_tile, c.k_tile}, true, segments), ref);
}

TEST(AttentionTest, OneSegmentIsBitwiseTheSameAsNoSegments) {
  const Inputs in = MakeInputs(2, 29, 6, 2, 10, 5, 160);
  const Result a = RunKernel(in, AttentionTiles{16, 8}, true);
  const Result b = RunKernel(in, AttentionTiles{16, 8}, true, std::vector<int32_t>(2 * 29, 3));
  EXPECT_TRUE(testing::BitwiseEqual(a.out, b.out));
  EXPECT_TRUE(testing::BitwiseEqual(a.lse, b.lse));
  EXPECT_TRUE(testing::BitwiseEqual(a.dq, b.dq));
  EXPECT_TRUE(testing::BitwiseEqual(a.dk, b.dk));
  EXPECT_TRUE(testing::BitwiseEqual(a.dv, b.dv));
}

// The slice [first, first + length) of every token's [heads * D] values.
std::vector<float> Tokens(const std::vector<float>& x, int64_t width, int64_t first,
                          int64_t length) {
  return std::vector<float>(x.begin() + first * width, x.begin() + (first + length) * width);
}

// The key property of packing: a row of 3 samples with segment ids gives each sample the
// outputs and gradients it gets alone in a row of its own length. The packed row's tiles cut
// the samples differently, so only rounding differs: the reference tolerances apply.
TEST(AttentionTest, PackedRowEqualsTheSamplesRunSeparately) {
  const int64_t hq = 6, hkv = 2, d = 10;
  const std::vector<int64_t> lengths = {7, 13, 9};
  const Inputs packed = MakeInputs(1, 29, hq, hkv, d, 0, 170);
  const std::vector<int32_t> segments = SegmentsOf({lengths});
  const AttentionTiles tiles{8, 8};
  const Result whole = RunKernel(packed, tiles, true, segments);
  int64_t first = 0;
  for (int64_t length : lengths) {
    Inputs alone;
    alone.shape = packed.shape;
    alone.shape.seq = length;
    alone.q = Tokens(packed.q, hq * d, first, length);
    alone.k = Tokens(packed.k, hkv * d, first, length);
    alone.v = Tokens(packed.v, hkv * d, first, length);
    alone.dout = Tokens(packed.dout, hq * d, first, length);
    const Result r = RunKernel(alone, tiles, true);
    EXPECT_TRUE(AllClose(Tokens(whole.out, hq * d, first, length), ToDouble(r.out), kOutAbs,
                         kOutRel)) << "out of the sample at " << first;
    EXPECT_TRUE(AllClose(Tokens(whole.dq, hq * d, first, length), ToDouble(r.dq), kGradAbs,
                         kGradRel)) << "dq of the sample at " << first;
    EXPECT_TRUE(AllClose(Tokens(whole.dk, hkv * d, first, length), ToDouble(r.dk), kGradAbs,
                         kGradRel)) << "dk of the sample at " << first;
    EXPECT_TRUE(AllClose(Tokens(whole.dv, hkv * d, first, length), ToDouble(r.dv), kGradAbs,
                         kGradRel)) << "dv of the sample at " << first;
    for (int64_t h = 0; h < hq; ++h) {
      for (int64_t i = 0; i < length; ++i) {
        EXPECT_NEAR(whole.lse[h * 29 + first + i], r.lse[h * length + i], kLseAbs);
      }
    }
    first += length;
  }
}

// Key tiles that no query of a tile can see are never computed: with segments on tile
// boundaries, NaN keys and values in the first segment reach nothing in the later ones (a
// computed tile would carry the NaN through 0 * NaN in P V or dS K).
TEST(AttentionTest, SkipsTilesOfOtherSegments) {
  const int64_t hq = 4, hkv = 2, d = 6;
  Inputs in = MakeInputs(1, 32, hq, hkv, d, 0, 180);
  const std::vector<int32_t> segments = SegmentsOf({{8, 16, 8}});
  for (int64_t t = 0; t < 8; ++t) {
    for (int64_t c = 0; c < hkv * d; ++c) {
      in.k[t * hkv * d + c] = NAN;
      in.v[t * hkv * d + c] = NAN;
    }
  }
  const Result r = RunKernel(in, AttentionTiles{8, 8}, true, segments);
  for (int64_t t = 8; t < 32; ++t) {
    for (int64_t c = 0; c < hq * d; ++c) {
      ASSERT_TRUE(std::isfinite(r.out[t * hq * d + c])) << "token " << t;
      ASSERT_TRUE(std::isfinite(r.dq[t * hq * d + c])) << "token " << t;
    }
    for (int64_t c = 0; c < hkv * d; ++c) {
      ASSERT_TRUE(std::isfinite(r.dk[t * hkv * d + c])) << "token " << t;
      ASSERT_TRUE(std::isfinite(r.dv[t * hkv * d + c])) << "token " << t;
    }
  }
}

}  // namespace
}  // namespace megatrain::kernels::cpu
