// The CUDA kernel bodies (block_reduce.h, rmsnorm_bodies.h,
// cross_entropy_bodies.h, thread_bodies.h) run on the CPU under the block
// emulator over their launchers' grids, against double references: float
// storage and the bf16 storage round trip, odd sizes (widths not multiples of
// 32 or of the block, 1-row and 1-column cases, rows past a dw group).
//
// Tolerances: float storage, 2e-5 relative + 1e-6 absolute (fp32 sums of at
// most a few thousand terms); bf16 storage adds the output rounding, at most
// half a bf16 ulp = 2^-8 relative. Inputs are bf16-representable in both
// cases, so the double reference sees exactly what the kernel sees.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "kernels/common/activations.h"
#include "kernels/common/bf16.h"
#include "kernels/common/softmax.h"
#include "kernels/cuda/block_reduce.h"
#include "kernels/cuda/cross_entropy_bodies.h"
#include "kernels/cuda/launch_geometry.h"
#include "kernels/cuda/rmsnorm_bodies.h"
#include "kernels/cuda/testing/block_emulator.h"
#include "kernels/cuda/testing/host_storage.h"
#include "kernels/cuda/thread_bodies.h"

namespace megatrain::kernels::cuda {
namespace {

using testing::EmulatedGrid;
using testing::EmulatedThread;
using testing::RunEmulatedGrid;

using testing::Bf16BitsStorage;
using testing::FloatStorage;

constexpr double kFloatRel = 2e-5;
constexpr double kFloatAbs = 1e-6;

// Deterministic values in [lo, hi), rounded to bf16 so both storages hold them exactly.
std::vector<float> Values(int64_t n, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  uint32_t state = seed * 2654435761u + 1u;
  for (auto& x : v) {
    state = state * 1664525u + 1013904223u;
    const float u = static_cast<float>(state >> 8) / static_cast<float>(1u << 24);
    x = Bf16BitsToFloat32(Float32ToBf16Bits(lo + (hi - lo) * u));
  }
  return v;
}

template <class S>
std::vector<typename S::T> Store(const std::vector<float>& v) {
  std::vector<typename S::T> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = S::Make(v[i]);
  return out;
}

template <class S>
double Loaded(typename S::T v) {
  return static_cast<double>(S::Load(v));
}

// |got - want| <= (rel + output rounding) * |want| + abs * scale.
template <class S>
void ExpectNear(const std::vector<typename S::T>& got, const std::vector<double>& want,
                double scale, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double bound = (kFloatRel + S::kOutputRounding) * std::fabs(want[i]) + kFloatAbs * scale;
    ASSERT_LE(std::fabs(Loaded<S>(got[i]) - want[i]), bound)
        << what << " element " << i << ": got " << Loaded<S>(got[i]) << " want " << want[i];
  }
}

void RunGrid(const LaunchShape& shape, size_t shared_bytes,
             const std::function<void(const EmulatedThread&)>& body) {
  const absl::Status status = RunEmulatedGrid(
      EmulatedGrid{shape.blocks_x, shape.blocks_y, shape.threads, shared_bytes}, body);
  ASSERT_TRUE(status.ok()) << status;
}

template <class S>
class BlockBodiesTest : public ::testing::Test {};
using Storages = ::testing::Types<FloatStorage, Bf16BitsStorage>;
TYPED_TEST_SUITE(BlockBodiesTest, Storages);

const std::vector<int> kWidths = {1, 31, 33, 255, 256, 257, 1000};

// ---------------------------------------------------------------- BlockSum

// The order BlockSum promises: each thread's strided partial, the xor
// butterfly within each warp, then the warps' totals in warp order.
float BlockSumInPromisedOrder(const std::vector<float>& values, int threads) {
  std::vector<float> partial(static_cast<size_t>(threads), 0.0f);
  for (size_t i = 0; i < values.size(); ++i) partial[i % static_cast<size_t>(threads)] += values[i];
  float total = 0.0f;
  for (int warp = 0; warp < threads / 32; ++warp) {
    std::vector<float> lanes(partial.begin() + warp * 32, partial.begin() + warp * 32 + 32);
    for (int offset = 16; offset > 0; offset >>= 1) {
      std::vector<float> next(32);
      for (int l = 0; l < 32; ++l) next[l] = lanes[l] + lanes[l ^ offset];
      lanes = next;
    }
    total += lanes[0];
  }
  return total;
}

TEST(BlockReduceTest, OrderedSumIsBitwiseThePromisedOrderAndCloseToDouble) {
  for (int64_t n : {1, 31, 255, 256, 257, 1000, 5003}) {
    const std::vector<float> values = Values(n, 7, -3.0f, 5.0f);
    float total = std::numeric_limits<float>::quiet_NaN();
    RunGrid(LaunchShape{1, 1, kSumThreads}, kSumThreads / 32 * sizeof(float),
            [&](const EmulatedThread& t) {
              OrderedSumBlock<kSumThreads>(values.data(), n, &total, static_cast<float*>(t.shared));
            });
    EXPECT_EQ(total, BlockSumInPromisedOrder(values, kSumThreads)) << "n=" << n;
    double want = 0.0, magnitude = 0.0;
    for (float v : values) want += v, magnitude += std::fabs(v);
    EXPECT_NEAR(total, want, 1e-6 * magnitude) << "n=" << n;
  }
}

TEST(BlockReduceTest, EveryThreadGetsTheSameTotals) {
  constexpr int kThreads = 128;
  std::vector<float> sums(kThreads);
  std::vector<OnlineSoftmax> states(kThreads);
  const std::vector<float> values = Values(kThreads, 3, -6.0f, 6.0f);
  RunGrid(LaunchShape{1, 1, kThreads}, kThreads / 32 * sizeof(OnlineSoftmax),
          [&](const EmulatedThread& t) {
            const float v = values[static_cast<size_t>(t.thread)];
            sums[static_cast<size_t>(t.thread)] =
                BlockSum<kThreads>(v, static_cast<float*>(t.shared));
            OnlineSoftmax s;
            OnlineSoftmaxMerge(&s, v, 1.0f);
            states[static_cast<size_t>(t.thread)] =
                BlockSoftmaxMerge<kThreads>(s, static_cast<OnlineSoftmax*>(t.shared));
          });
  double sum = 0.0, max = -INFINITY;
  for (float v : values) sum += v, max = std::fmax(max, v);
  double exp_sum = 0.0;
  for (float v : values) exp_sum += std::exp(v - max);
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(sums[static_cast<size_t>(t)], sums[0]) << "thread " << t;
    EXPECT_EQ(states[static_cast<size_t>(t)].max, states[0].max) << "thread " << t;
    EXPECT_EQ(states[static_cast<size_t>(t)].sum, states[0].sum) << "thread " << t;
  }
  EXPECT_NEAR(sums[0], sum, 1e-5 * kThreads);
  EXPECT_EQ(states[0].max, static_cast<float>(max));
  EXPECT_NEAR(states[0].sum, exp_sum, 1e-5 * exp_sum);
}

// ------------------------------------------------------------------ RMSNorm

struct RmsnormReference {
  std::vector<double> y, rstd, dx, dw;
};

RmsnormReference RmsnormDouble(const std::vector<double>& x, const std::vector<double>& w,
                               const std::vector<double>& dy, const std::vector<double>& dx_in,
                               const std::vector<double>& dw_in, int64_t rows, int dim,
                               double eps) {
  RmsnormReference r{std::vector<double>(x.size()), std::vector<double>(rows),
                     std::vector<double>(x.size()), dw_in};
  for (int64_t i = 0; i < rows; ++i) {
    double ss = 0.0, dot = 0.0;
    for (int c = 0; c < dim; ++c) {
      const double v = x[i * dim + c];
      ss += v * v;
      dot += w[c] * dy[i * dim + c] * v;
    }
    const double rstd = 1.0 / std::sqrt(ss / dim + eps);
    r.rstd[i] = rstd;
    for (int c = 0; c < dim; ++c) {
      const size_t k = static_cast<size_t>(i * dim + c);
      r.y[k] = x[k] * rstd * w[c];
      r.dx[k] = dx_in[k] + rstd * (w[c] * dy[k] - x[k] * rstd * rstd * dot / dim);
      r.dw[c] += dy[k] * x[k] * rstd;
    }
  }
  return r;
}

template <class S>
std::vector<double> Widen(const std::vector<typename S::T>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = Loaded<S>(v[i]);
  return out;
}

// Forward, then the backward exactly as launch::RmsnormBackward sequences it
// (dx rows, dw partials by row group, dw final), with dx accumulated into and
// dw added to existing values.
TYPED_TEST(BlockBodiesTest, RmsnormForwardAndBackwardMatchDouble) {
  using S = TypeParam;
  constexpr float kEps = 1e-5f;
  for (int64_t rows : {1, 3, 65}) {
    for (int dim : kWidths) {
      if (rows == 65 && dim != 33) continue;  // 65 rows only to cross a dw row group
      const std::string what = "rows=" + std::to_string(rows) + " dim=" + std::to_string(dim);
      const int64_t n = rows * dim;
      const auto x = Store<S>(Values(n, 1));
      const auto w = Store<S>(Values(dim, 2, 0.5f, 1.5f));
      const auto dy = Store<S>(Values(n, 3));
      auto y = Store<S>(std::vector<float>(static_cast<size_t>(n), NAN));
      std::vector<float> rstd(static_cast<size_t>(rows), NAN);
      RunGrid(RowGrid(rows), kRowThreads / 32 * sizeof(float), [&](const EmulatedThread& t) {
        RmsnormForwardRow<S, kRowThreads>(x.data(), w.data(), dim, kEps, y.data(), rstd.data(),
                                          static_cast<float*>(t.shared));
      });

      const std::vector<float> dx_start = Values(n, 4, -0.5f, 0.5f);
      auto dx = Store<S>(dx_start);
      const std::vector<float> dw_start = Values(dim, 5, -0.25f, 0.25f);
      std::vector<float> dw = dw_start;
      std::vector<float> partials(static_cast<size_t>(DwRowGroups(rows) * dim), NAN);
      RunGrid(RowGrid(rows), kRowThreads / 32 * sizeof(float), [&](const EmulatedThread& t) {
        RmsnormBackwardInputRow<S, kRowThreads>(x.data(), w.data(), rstd.data(), dy.data(), dim,
                                                /*accumulate=*/true, dx.data(),
                                                static_cast<float*>(t.shared));
      });
      RunGrid(DwPartialGrid(rows, dim), 0, [&](const EmulatedThread& t) {
        RmsnormDwPartialThread<S>(t.block_y, ColumnIndex(t.block_x, t.thread, t.threads), rows, dim,
                                  x.data(), dy.data(), rstd.data(), partials.data());
      });
      RunGrid(DwFinalGrid(dim), 0, [&](const EmulatedThread& t) {
        RmsnormDwFinalThread(ColumnIndex(t.block_x, t.thread, t.threads), DwRowGroups(rows), dim,
                             partials.data(), dw.data());
      });

      const std::vector<double> dx_in = Widen<S>(Store<S>(dx_start));
      const RmsnormReference ref =
          RmsnormDouble(Widen<S>(x), Widen<S>(w), Widen<S>(dy), dx_in,
                        std::vector<double>(dw_start.begin(), dw_start.end()), rows, dim, kEps);
      ExpectNear<FloatStorage>(rstd, ref.rstd, 1.0, what + " rstd");
      ExpectNear<S>(y, ref.y, 1.0, what + " y");
      // dx sums dim terms of size up to ~|w dy| rstd; its error scales with them.
      double dx_scale = 1.0;
      for (double r : ref.rstd) dx_scale = std::fmax(dx_scale, 4.0 * r);
      ExpectNear<S>(dx, ref.dx, dx_scale, what + " dx");
      ExpectNear<FloatStorage>(dw, ref.dw, static_cast<double>(rows), what + " dw");
    }
  }
}

// ------------------------------------------------------------ Cross-entropy

struct CrossEntropyReference {
  std::vector<double> loss;     // per row; NaN for a target >= vocab
  std::vector<double> dlogits;  // [rows, vocab]
};

CrossEntropyReference CrossEntropyDouble(const std::vector<double>& logits,
                                         const std::vector<int32_t>& targets, int64_t vocab,
                                         double scale) {
  const int64_t rows = static_cast<int64_t>(targets.size());
  CrossEntropyReference r{std::vector<double>(static_cast<size_t>(rows)),
                          std::vector<double>(logits.size(), 0.0)};
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t target = targets[static_cast<size_t>(i)];
    if (target < 0) continue;
    if (target >= vocab) {
      r.loss[static_cast<size_t>(i)] = NAN;
      continue;
    }
    double max = -INFINITY;
    for (int64_t c = 0; c < vocab; ++c) max = std::fmax(max, logits[i * vocab + c]);
    double sum = 0.0;
    for (int64_t c = 0; c < vocab; ++c) sum += std::exp(logits[i * vocab + c] - max);
    const double lse = max + std::log(sum);
    r.loss[static_cast<size_t>(i)] = lse - logits[i * vocab + target];
    for (int64_t c = 0; c < vocab; ++c) {
      r.dlogits[i * vocab + c] =
          (std::exp(logits[i * vocab + c] - lse) - (c == target ? 1.0 : 0.0)) * scale;
    }
  }
  return r;
}

// Rows: first class, last class, ignored, out of range (NaN loss), a middle
// class on logits shifted by +100 (exp would overflow fp32 unshifted).
struct CrossEntropyCase {
  std::vector<float> logits;
  std::vector<int32_t> targets;
};

CrossEntropyCase MakeCrossEntropyCase(int64_t vocab) {
  CrossEntropyCase c;
  c.targets = {0, static_cast<int32_t>(vocab - 1), -1, static_cast<int32_t>(vocab),
               static_cast<int32_t>(vocab / 2)};
  c.logits = Values(5 * vocab, 11, -4.0f, 4.0f);
  for (int64_t k = 4 * vocab; k < 5 * vocab; ++k) c.logits[static_cast<size_t>(k)] += 100.0f;
  return c;
}

void ExpectLosses(const std::vector<float>& got, const std::vector<double>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << what << " row " << i << ": got " << got[i];
      continue;
    }
    // lse carries the logits' magnitude (up to ~104); fp32 keeps ~1e-7 of it.
    EXPECT_NEAR(got[i], want[i], 2e-5 * 105.0) << what << " row " << i;
  }
}

TYPED_TEST(BlockBodiesTest, CrossEntropyRowsMatchDoubleIncludingInPlace) {
  using S = TypeParam;
  for (int64_t vocab : {1, 31, 257, 1000}) {
    for (bool in_place : {false, true}) {
      const std::string what = "vocab=" + std::to_string(vocab) + (in_place ? " in place" : "");
      const CrossEntropyCase c = MakeCrossEntropyCase(vocab);
      const int64_t rows = static_cast<int64_t>(c.targets.size());
      const float scale = 0.25f;
      auto logits = Store<S>(c.logits);
      const std::vector<double> logits_wide = Widen<S>(logits);
      auto separate = Store<S>(std::vector<float>(logits.size(), NAN));
      typename S::T* dlogits = in_place ? logits.data() : separate.data();
      std::vector<float> row_loss(static_cast<size_t>(rows), -7.0f);
      RunGrid(
          RowGrid(rows), kRowThreads / 32 * sizeof(OnlineSoftmax), [&](const EmulatedThread& t) {
            CrossEntropyRow<S, kRowThreads>(logits.data(), c.targets.data(), vocab, scale, dlogits,
                                            row_loss.data(), static_cast<OnlineSoftmax*>(t.shared));
          });
      const CrossEntropyReference ref = CrossEntropyDouble(logits_wide, c.targets, vocab, scale);
      ExpectLosses(row_loss, ref.loss, what);
      ExpectNear<S>(in_place ? logits : separate, ref.dlogits, 1.0, what + " dlogits");
    }
  }
}

// The vocabulary-block path as the LM head drives it: reset, per block the
// stats, the loss from the states, then per block the gradient.
TYPED_TEST(BlockBodiesTest, CrossEntropyOverVocabularyBlocksMatchesDouble) {
  using S = TypeParam;
  for (const auto& [vocab, block_vocab] :
       std::vector<std::pair<int64_t, int64_t>>{{1000, 300}, {257, 100}, {31, 31}, {2, 1}}) {
    const std::string what =
        "vocab=" + std::to_string(vocab) + " block=" + std::to_string(block_vocab);
    const CrossEntropyCase c = MakeCrossEntropyCase(vocab);
    const int64_t rows = static_cast<int64_t>(c.targets.size());
    const float scale = 0.5f;
    const auto logits = Store<S>(c.logits);
    std::vector<float> row_max(rows, 3.0f), row_sum(rows, 3.0f), target_logit(rows, 3.0f);
    std::vector<float> row_loss(rows, -7.0f);
    const LaunchShape per_row{CeilDiv(rows, 256), 1, 256};
    RunGrid(per_row, 0, [&](const EmulatedThread& t) {
      HeadStatsResetThread(ElementIndex(t.block_x, t.thread, t.threads), rows, row_max.data(),
                           row_sum.data(), target_logit.data());
    });
    // One vocabulary block's logits [rows, width] copied out of the full rows.
    auto block_of = [&](int64_t first, int64_t width) {
      std::vector<typename S::T> b(static_cast<size_t>(rows * width));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = 0; k < width; ++k) b[r * width + k] = logits[r * vocab + first + k];
      return b;
    };
    for (int64_t first = 0; first < vocab; first += block_vocab) {
      const int64_t width = std::min(block_vocab, vocab - first);
      const auto block = block_of(first, width);
      RunGrid(
          RowGrid(rows), kRowThreads / 32 * sizeof(OnlineSoftmax), [&](const EmulatedThread& t) {
            HeadBlockStatsRow<S, kRowThreads>(block.data(), c.targets.data(), width, first,
                                              row_max.data(), row_sum.data(), target_logit.data(),
                                              static_cast<OnlineSoftmax*>(t.shared));
          });
    }
    RunGrid(per_row, 0, [&](const EmulatedThread& t) {
      HeadRowLossThread(ElementIndex(t.block_x, t.thread, t.threads), rows, row_max.data(),
                        row_sum.data(), target_logit.data(), c.targets.data(), row_loss.data());
    });
    std::vector<double> dlogits(static_cast<size_t>(rows * vocab), NAN);
    for (int64_t first = 0; first < vocab; first += block_vocab) {
      const int64_t width = std::min(block_vocab, vocab - first);
      auto block = block_of(first, width);  // graded in place, as the head does
      RunGrid(RowGrid(rows), 0, [&](const EmulatedThread&) {
        HeadBlockGradRow<S, kRowThreads>(block.data(), c.targets.data(), width, first,
                                         row_max.data(), row_sum.data(), scale, block.data());
      });
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = 0; k < width; ++k)
          dlogits[r * vocab + first + k] = Loaded<S>(block[r * width + k]);
    }
    // A target >= vocab is never met by a block, but its row is not ignored,
    // so it gets a gradient like any row; only its loss is poisoned. Compare
    // that row to the softmax without a target.
    const std::vector<double> wide = Widen<S>(logits);
    CrossEntropyReference ref = CrossEntropyDouble(wide, c.targets, vocab, scale);
    {
      std::vector<int32_t> as_row0 = c.targets;
      as_row0[3] = 0;
      const CrossEntropyReference with_class0 = CrossEntropyDouble(wide, as_row0, vocab, scale);
      for (int64_t k = 0; k < vocab; ++k)
        ref.dlogits[3 * vocab + k] = with_class0.dlogits[3 * vocab + k] + (k == 0 ? scale : 0.0);
    }
    ExpectLosses(row_loss, ref.loss, what);
    for (size_t k = 0; k < dlogits.size(); ++k) {
      const double bound = (kFloatRel + S::kOutputRounding) * std::fabs(ref.dlogits[k]) + kFloatAbs;
      ASSERT_LE(std::fabs(dlogits[k] - ref.dlogits[k]), bound)
          << what << " dlogits " << k << ": got " << dlogits[k] << " want " << ref.dlogits[k];
    }
  }
}

// ------------------------------------------------------ Element-wise bodies

template <class S>
void RunElementwise(int64_t n, const std::function<void(int64_t)>& body) {
  RunGrid(ElementwiseGrid(n), 0,
          [&](const EmulatedThread& t) { body(ElementIndex(t.block_x, t.thread, t.threads)); });
}

TYPED_TEST(BlockBodiesTest, ElementwiseBodiesMatchDouble) {
  using S = TypeParam;
  for (int64_t n : {1, 31, 257, 1000}) {
    const std::string what = "n=" + std::to_string(n);
    const auto a = Store<S>(Values(n, 21, -6.0f, 6.0f));
    const auto b = Store<S>(Values(n, 22, -6.0f, 6.0f));
    const auto dy = Store<S>(Values(n, 23));
    auto sum = Store<S>(std::vector<float>(n, NAN));
    auto swiglu = sum, d_gate = sum, d_up = sum;
    RunElementwise<S>(n, [&](int64_t i) {
      ResidualAddThread<S>(i, n, a.data(), b.data(), sum.data());
      SwigluForwardThread<S>(i, n, a.data(), b.data(), swiglu.data());
      SwigluBackwardThread<S>(i, n, a.data(), b.data(), dy.data(), d_gate.data(), d_up.data());
    });
    std::vector<double> want_sum(n), want_swiglu(n), want_dg(n), want_du(n);
    for (int64_t i = 0; i < n; ++i) {
      const double g = Loaded<S>(a[i]), u = Loaded<S>(b[i]), d = Loaded<S>(dy[i]);
      const double s = 1.0 / (1.0 + std::exp(-g));
      want_sum[i] = g + u;
      want_swiglu[i] = g * s * u;
      want_du[i] = g * s * d;
      want_dg[i] = u * d * (s + g * s * (1.0 - s));
    }
    ExpectNear<S>(sum, want_sum, 1.0, what + " residual");
    ExpectNear<S>(swiglu, want_swiglu, 1.0, what + " swiglu");
    ExpectNear<S>(d_gate, want_dg, 1.0, what + " d_gate");
    ExpectNear<S>(d_up, want_du, 1.0, what + " d_up");
  }
}

TYPED_TEST(BlockBodiesTest, RopeBodyMatchesDoubleAndBackwardInverts) {
  using S = TypeParam;
  constexpr int kHeads = 3, kSeq = 5;
  for (int head_dim : {2, 6, 64}) {
    for (int64_t tokens : {1, 7}) {
      const int half = head_dim / 2;
      const int64_t n = tokens * kHeads * head_dim;
      std::vector<float> cos_table(kSeq * half), sin_table(kSeq * half);
      for (int p = 0; p < kSeq; ++p) {
        for (int i = 0; i < half; ++i) {
          const double angle = p * std::pow(10000.0, -2.0 * i / head_dim);
          cos_table[p * half + i] = static_cast<float>(std::cos(angle));
          sin_table[p * half + i] = static_cast<float>(std::sin(angle));
        }
      }
      // Positions from the token index (plain windows) or given per token (packed samples).
      for (const bool given : {false, true}) {
      std::vector<int32_t> positions(tokens);
      for (int64_t t = 0; t < tokens; ++t) positions[t] = static_cast<int32_t>((t * 3 + 1) % kSeq);
      const int32_t* position_arg = given ? positions.data() : nullptr;
      auto position_of = [&](int64_t t) { return given ? positions[t] : t % kSeq; };
      const auto start = Store<S>(Values(n, 31));
      auto x = start;
      const int64_t pairs = tokens * kHeads * half;
      RunElementwise<S>(pairs, [&](int64_t p) {
        RopeThread<S>(p, pairs, x.data(), kHeads, head_dim, kSeq, cos_table.data(),
                      sin_table.data(), position_arg, /*backward=*/false);
      });
      std::vector<double> want(n);
      for (int64_t t = 0; t < tokens; ++t) {
        for (int h = 0; h < kHeads; ++h) {
          for (int i = 0; i < half; ++i) {
            const int64_t lo = (t * kHeads + h) * head_dim + i;
            const double c = cos_table[position_of(t) * half + i];
            const double s = sin_table[position_of(t) * half + i];
            const double xl = Loaded<S>(start[lo]), xh = Loaded<S>(start[lo + half]);
            want[lo] = xl * c - xh * s;
            want[lo + half] = xh * c + xl * s;
          }
        }
      }
      const std::string what =
          "head_dim=" + std::to_string(head_dim) + (given ? " given positions" : "");
      ExpectNear<S>(x, want, 4.0, what + " rope");
      RunElementwise<S>(pairs, [&](int64_t p) {
        RopeThread<S>(p, pairs, x.data(), kHeads, head_dim, kSeq, cos_table.data(),
                      sin_table.data(), position_arg, /*backward=*/true);
      });
      // The inverse rotation of the stored result: back to the start within
      // two roundings (one per pass) of the storage.
      std::vector<double> back(start.size());
      for (size_t i = 0; i < start.size(); ++i) back[i] = Loaded<S>(start[i]);
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_NEAR(Loaded<S>(x[i]), back[i], 2e-5 * 4 + 4 * S::kOutputRounding * 3.0)
            << what << " element " << i;
      }
      }
    }
  }
}

TYPED_TEST(BlockBodiesTest, EmbeddingForwardGathersAndPoisonsBadIds) {
  using S = TypeParam;
  constexpr int64_t kVocab = 11;
  for (int dim : {1, 33, 257}) {
    const std::vector<int32_t> ids = {3, 0, 10, -1, 11, 3};
    const auto table = Store<S>(Values(kVocab * dim, 41));
    const int64_t n = static_cast<int64_t>(ids.size()) * dim;
    auto out = Store<S>(std::vector<float>(n, 9.0f));
    RunElementwise<S>(n, [&](int64_t i) {
      EmbeddingForwardThread<S>(i, n, ids.data(), table.data(), kVocab, dim, out.data());
    });
    for (size_t t = 0; t < ids.size(); ++t) {
      for (int c = 0; c < dim; ++c) {
        const double got = Loaded<S>(out[t * dim + c]);
        if (ids[t] < 0 || ids[t] >= kVocab) {
          ASSERT_TRUE(std::isnan(got)) << "token " << t << " id " << ids[t];
        } else {
          ASSERT_EQ(got, Loaded<S>(table[ids[t] * dim + c])) << "token " << t << " col " << c;
        }
      }
    }
  }
}

// Segments as BuildEmbeddingGradIndex makes them: unique rows, each with its
// tokens in order; dtable rows start non-zero (the kernel adds).
TYPED_TEST(BlockBodiesTest, EmbeddingBackwardAddsEachSegmentInTokenOrder) {
  using S = TypeParam;
  const std::vector<int32_t> unique_rows = {0, 4, 9};
  const std::vector<int32_t> offsets = {0, 3, 4, 6};
  const std::vector<int32_t> token_order = {1, 2, 5, 0, 3, 4};  // tokens of rows 0 | 4 | 9
  for (int dim : {1, 33, 257}) {
    const auto dout = Store<S>(Values(6 * dim, 61));
    const std::vector<float> start = Values(10 * dim, 62);
    std::vector<float> dtable = start;
    RunGrid(EmbeddingBackwardGrid(3, dim), 0, [&](const EmulatedThread& t) {
      EmbeddingBackwardThread<S>(t.block_x, ColumnIndex(t.block_y, t.thread, t.threads),
                                 unique_rows.data(), offsets.data(), token_order.data(),
                                 dout.data(), dim, dtable.data());
    });
    std::vector<double> want(start.begin(), start.end());
    for (size_t u = 0; u < unique_rows.size(); ++u)
      for (int32_t k = offsets[u]; k < offsets[u + 1]; ++k)
        for (int c = 0; c < dim; ++c)
          want[unique_rows[u] * dim + c] += Loaded<S>(dout[token_order[k] * dim + c]);
    ExpectNear<FloatStorage>(dtable, want, 4.0, "dim=" + std::to_string(dim) + " dtable");
  }
}

// -------------------------------------------------------- bf16 round trip

// The bf16 nearest to x by a double comparison of the two candidates around
// it, ties to the even one; overflow past the largest bf16 rounds to inf
// when x lies at or beyond the midpoint to 2^128.
uint16_t NearestBf16(float x) {
  uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  const uint16_t down = static_cast<uint16_t>(bits >> 16);  // toward zero
  const uint16_t up = static_cast<uint16_t>(down + 1);      // away from zero
  const auto value = [](uint16_t b) {
    if ((b & 0x7fffu) == 0x7f80u) return std::ldexp((b & 0x8000u) ? -1.0 : 1.0, 128);
    return static_cast<double>(Bf16BitsToFloat32(b));
  };
  const double d_down = std::fabs(value(down) - x), d_up = std::fabs(value(up) - x);
  if (d_down < d_up) return down;
  if (d_up < d_down) return up;
  return (down & 1u) == 0 ? down : up;
}

TEST(Bf16RoundTripTest, RoundToStorageBodyIsNearestEvenAndWideningIsExact) {
  std::vector<float> in = Values(1001, 51, -1e5f, 1e5f);
  for (uint32_t bits :
       {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x3f807fffu, 0x7f7fffffu, 0x7f7f8000u, 0x7f7f7fffu,
        0xff7fffffu, 0x00008000u, 0x00018000u, 0x80000000u, 0x00000001u}) {
    float f = 0.0f;
    std::memcpy(&f, &bits, sizeof f);
    in.push_back(f);
  }
  for (float v : Values(500, 52, -3.0f, 3.0f)) in.push_back(v * 1.00390625f);  // off-grid
  in.push_back(INFINITY);
  in.push_back(-INFINITY);
  in.push_back(NAN);
  const int64_t n = static_cast<int64_t>(in.size());
  std::vector<uint16_t> out(in.size(), 0x1234u);
  RunElementwise<Bf16BitsStorage>(
      n, [&](int64_t i) { RoundToStorageThread<Bf16BitsStorage>(i, n, in.data(), out.data()); });
  for (size_t i = 0; i < in.size(); ++i) {
    if (std::isnan(in[i])) {
      EXPECT_TRUE(std::isnan(Bf16BitsToFloat32(out[i])));
      continue;
    }
    if (std::isinf(in[i])) {
      EXPECT_EQ(Bf16BitsToFloat32(out[i]), in[i]);
      continue;
    }
    EXPECT_EQ(out[i], NearestBf16(in[i])) << "input " << in[i] << " index " << i;
    // Widening a stored value and storing it again is the identity.
    EXPECT_EQ(Float32ToBf16Bits(Bf16BitsToFloat32(out[i])), out[i]);
  }
}

}  // namespace
}  // namespace megatrain::kernels::cuda
