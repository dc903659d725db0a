// Tests for the chunked, vocabulary-blocked LM head + cross-entropy against a
// double reference, for one block, odd blocks with a short last one, and
// blocks of one row.
#include "kernels/cpu/lm_head_loss.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/test_util.h"

namespace megatrain::kernels::cpu {
namespace {

using testing::AllClose;
using testing::RandomFloats;
using testing::ToDouble;

constexpr int64_t kN = 20;
constexpr int64_t kD = 37;
constexpr int64_t kVocab = 53;
constexpr int64_t kChunk = 7;  // chunks: rows 0-6, 7-13 (all ignored), 14-19 (short)

// Rows 7..13 are all ignored; a few more ignored rows elsewhere.
const std::vector<int32_t> kTargets = {3,  52, -1, 0,  17, 17, 9, -1, -1, -1,
                                       -1, -1, -1, -1, 44, -1, 1, 30, 52, 5};

// Tolerances: logits are dot products of K=37 values in [-1, 1] (fp32 error
// ~1e-6); per-row lse and loss ~1e-6 each, summed over 11 rows: loss 2e-5 abs.
// dlogits are probabilities (<= 1) times the scale; dh and dw are GEMMs of
// length V=53 and chunk<=7 over them: 1e-6 + 2e-7 * K abs (about 10x the
// observed error) plus 1e-5 rel.
constexpr double kLossAbs = 2e-5;

struct Reference {
  double loss_sum = 0.0;
  int64_t valid = 0;
  std::vector<double> logits, dh, dw;
};

Reference RunReference(const std::vector<double>& h, const std::vector<double>& w, double scale) {
  Reference ref;
  ref.logits.assign(kN * kVocab, 0.0);
  ref.dh.assign(kN * kD, 0.0);
  ref.dw.assign(kVocab * kD, 0.0);
  std::vector<double> dlogits(kVocab);
  for (int64_t r = 0; r < kN; ++r) {
    double max = -INFINITY;
    for (int64_t j = 0; j < kVocab; ++j) {
      double dot = 0.0;
      for (int64_t c = 0; c < kD; ++c) dot += h[r * kD + c] * w[j * kD + c];
      ref.logits[r * kVocab + j] = dot;
      max = std::max(max, dot);
    }
    const int32_t t = kTargets[r];
    if (t < 0) continue;
    ++ref.valid;
    double sum = 0.0;
    for (int64_t j = 0; j < kVocab; ++j) sum += std::exp(ref.logits[r * kVocab + j] - max);
    const double lse = max + std::log(sum);
    ref.loss_sum += lse - ref.logits[r * kVocab + t];
    for (int64_t j = 0; j < kVocab; ++j) {
      dlogits[j] = (std::exp(ref.logits[r * kVocab + j] - lse) - (j == t ? 1.0 : 0.0)) * scale;
      for (int64_t c = 0; c < kD; ++c) {
        ref.dh[r * kD + c] += dlogits[j] * w[j * kD + c];
        ref.dw[j * kD + c] += dlogits[j] * h[r * kD + c];
      }
    }
  }
  return ref;
}

struct Inputs {
  std::vector<float> h = RandomFloats(kN * kD, 1, -1.0f, 1.0f);
  std::vector<float> w = RandomFloats(kVocab * kD, 2, -1.0f, 1.0f);
  // Scale as if other micro-batches had 5 more valid tokens.
  float scale = 1.0f / (11.0f + 5.0f);
};

// Vocabulary block rows: 0 = one block; 11 = four blocks and a short one of 9;
// 1 = a block per row (a block holding no target of a chunk, every block
// merged into states that already hold others).
class LmHeadBlocksTest : public ::testing::TestWithParam<int64_t> {};

INSTANTIATE_TEST_SUITE_P(BlockRows, LmHeadBlocksTest, ::testing::Values(0, 11, 1));

TEST_P(LmHeadBlocksTest, LossAndGradientsMatchDouble) {
  const Inputs in;
  std::vector<float> scratch(kChunk * kVocab, NAN);
  std::vector<float> dh(kN * kD, NAN);  // NaN proves dh is overwritten, ignored rows too
  std::vector<float> dw(kVocab * kD, NAN);  // and dw
  const LmHeadLossResult result =
      LmHeadCrossEntropy(in.h.data(), in.w.data(), kTargets.data(), kN, kD, kVocab, kChunk,
                         GetParam(), in.scale, scratch.data(), dh.data(), dw.data());
  const Reference ref = RunReference(ToDouble(in.h), ToDouble(in.w), in.scale);
  EXPECT_EQ(result.valid_count, 11);
  EXPECT_EQ(result.valid_count, ref.valid);
  EXPECT_NEAR(result.loss_sum, ref.loss_sum, kLossAbs);
  EXPECT_TRUE(AllClose(dh, ref.dh, 1e-6 + 2e-7 * kVocab, 1e-5));
  EXPECT_TRUE(AllClose(dw, ref.dw, 1e-6 + 2e-7 * kChunk, 1e-5));
  for (int64_t r = 7; r < 14; ++r) {
    for (int64_t c = 0; c < kD; ++c) EXPECT_EQ(dh[r * kD + c], 0.0f);
  }
}

TEST_P(LmHeadBlocksTest, LossOnlyPassAndDeterminism) {
  const Inputs in;
  std::vector<float> scratch(kChunk * kVocab);
  const LmHeadLossResult loss_only =
      LmHeadCrossEntropy(in.h.data(), in.w.data(), kTargets.data(), kN, kD, kVocab, kChunk,
                         GetParam(), in.scale, scratch.data(), nullptr, nullptr);
  std::vector<float> dh[2], dw[2];
  LmHeadLossResult full[2];
  for (int run = 0; run < 2; ++run) {
    dh[run].assign(kN * kD, 0.0f);
    dw[run].assign(kVocab * kD, 0.0f);
    full[run] = LmHeadCrossEntropy(in.h.data(), in.w.data(), kTargets.data(), kN, kD, kVocab,
                                   kChunk, GetParam(), in.scale, scratch.data(), dh[run].data(),
                                   dw[run].data());
  }
  EXPECT_EQ(loss_only.loss_sum, full[0].loss_sum);
  EXPECT_EQ(full[0].loss_sum, full[1].loss_sum);
  EXPECT_TRUE(testing::BitwiseEqual(dh[0], dh[1]));
  EXPECT_TRUE(testing::BitwiseEqual(dw[0], dw[1]));
}

TEST_P(LmHeadBlocksTest, AllIgnoredGivesZeroLossAndZeroGradients) {
  const Inputs in;
  const std::vector<int32_t> ignored(kN, -100);
  std::vector<float> scratch(kChunk * kVocab);
  std::vector<float> dh(kN * kD, NAN);
  std::vector<float> dw(kVocab * kD, NAN);
  const LmHeadLossResult result =
      LmHeadCrossEntropy(in.h.data(), in.w.data(), ignored.data(), kN, kD, kVocab, kChunk,
                         GetParam(), in.scale, scratch.data(), dh.data(), dw.data());
  EXPECT_EQ(result.valid_count, 0);
  EXPECT_EQ(result.loss_sum, 0.0);
  for (float x : dw) EXPECT_EQ(x, 0.0f);
  for (float x : dh) EXPECT_EQ(x, 0.0f);
}

TEST_P(LmHeadBlocksTest, BlockLogitsMatchDouble) {
  const Inputs in;
  const int64_t rows = GetParam() > 0 ? GetParam() : kVocab;
  std::vector<float> logits(kN * kVocab, NAN);
  for (int64_t first = 0; first < kVocab; first += rows) {
    const LmHeadBlock block{in.h.data(), in.w.data() + first * kD, kTargets.data(), kN, kD, first,
                            std::min(rows, kVocab - first), kChunk, nullptr};
    LmHeadBlockLogits(block, kVocab, logits.data());
  }
  const Reference ref = RunReference(ToDouble(in.h), ToDouble(in.w), in.scale);
  EXPECT_TRUE(AllClose(logits, ref.logits, 1e-6 + 2e-7 * kD, 1e-6));
}

TEST(LmHeadLossTest, LogitsMatchDouble) {
  const Inputs in;
  std::vector<float> logits(kN * kVocab);
  LmHeadLogits(in.h.data(), in.w.data(), kN, kD, kVocab, logits.data());
  const Reference ref = RunReference(ToDouble(in.h), ToDouble(in.w), in.scale);
  EXPECT_TRUE(AllClose(logits, ref.logits, 1e-6 + 2e-7 * kD, 1e-6));
}

// The reference gradient against central differences of scale * loss_sum.
TEST(LmHeadLossTest, ReferenceGradientMatchesFiniteDifference) {
  const Inputs in;
  std::vector<double> h = ToDouble(in.h), w = ToDouble(in.w);
  const Reference ref = RunReference(h, w, in.scale);
  const double step = 1e-6;
  auto check = [&](std::vector<double>& x, const std::vector<double>& grad, const char* name) {
    for (size_t i = 0; i < x.size(); i += 5) {
      const double saved = x[i];
      x[i] = saved + step;
      const double plus = RunReference(h, w, in.scale).loss_sum * in.scale;
      x[i] = saved - step;
      const double minus = RunReference(h, w, in.scale).loss_sum * in.scale;
      x[i] = saved;
      EXPECT_NEAR(grad[i], (plus - minus) / (2 * step), 1e-8) << name << "[" << i << "]";
    }
  };
  check(h, ref.dh, "dh");
  check(w, ref.dw, "dw");
}

}  // namespace
}  // namespace megatrain::kernels::cpu
