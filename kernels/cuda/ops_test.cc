// Every CUDA op against a double-precision reference, as the cases of one parameterised harness
// over odd sizes (skipped without a GPU), plus argument validation (runs everywhere: it fails
// before touching the device).
#include "kernels/cuda/ops.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/common/rope.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/embedding_grad_index.h"
#include "kernels/cuda/testing/attention_reference.h"

namespace megatrain::kernels::cuda {
namespace {

using testing::DeviceBuffer;
using testing::ExpectClose;
using testing::FromBf16;
using ::testing::HasSubstr;
using testing::RandomBf16Values;
using testing::TestStream;
using testing::ToBf16;

// bf16 outputs: one rounding of a value computed in fp32 is <= 2^-8 relative;
// 1e-2 relative plus a small absolute term for values near zero.
constexpr double kBf16Rel = 1e-2;

// A non-null pointer that must never be dereferenced (validation fails first).
void* const kFake = reinterpret_cast<void*>(0x1000);
cudaStream_t const kFakeStream = reinterpret_cast<cudaStream_t>(0x1000);

TEST(OpsValidationTest, RejectsDefaultStream) {
  const absl::Status s = ResidualAdd(kFake, kFake, kFake, 10, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("default stream"));
  EXPECT_FALSE(SwigluForward(kFake, kFake, kFake, 10, cudaStreamLegacy).ok());
  EXPECT_FALSE(SwigluForward(kFake, kFake, kFake, 10, cudaStreamPerThread).ok());
}

TEST(OpsValidationTest, NamesBadFieldsAndValues) {
  absl::Status s = ResidualAdd(kFake, kFake, kFake, -3, kFakeStream);
  EXPECT_THAT(s.message(), HasSubstr("n = -3"));
  s = AccumulateFp32(static_cast<float*>(kFake), nullptr, 5, kFakeStream);
  EXPECT_THAT(s.message(), HasSubstr("sum is null"));
  s = SwigluBackward(kFake, nullptr, kFake, kFake, kFake, 7, kFakeStream);
  EXPECT_THAT(s.message(), HasSubstr("up is null"));
  s = RopeInPlace(kFake, 4, 2, 7, 4, static_cast<float*>(kFake), static_cast<float*>(kFake), false,
                  kFakeStream);
  EXPECT_THAT(s.message(), HasSubstr("head_dim = 7"));
  s = RmsnormForward(kFake, kFake, 3, 0, 1e-5f, kFake, static_cast<float*>(kFake), kFakeStream);
  EXPECT_THAT(s.message(), HasSubstr("dim = 0"));
  s = RmsnormBackward(kFake, kFake, static_cast<float*>(kFake), kFake, 100, 33, false, kFake,
                      static_cast<float*>(kFake), static_cast<float*>(kFake), 5, kFakeStream);
  EXPECT_THAT(s.message(), HasSubstr("workspace_floats = 5"));
  s = CrossEntropy(kFake, static_cast<int32_t*>(kFake), 2, 0, 1.0f, kFake,
                   static_cast<float*>(kFake), static_cast<float*>(kFake), kFakeStream);
  EXPECT_THAT(s.message(), HasSubstr("vocab = 0"));
  s = HeadBlockStats(kFake, static_cast<int32_t*>(kFake), 2, 0, 0, static_cast<float*>(kFake),
                     static_cast<float*>(kFake), static_cast<float*>(kFake), kFakeStream);
  EXPECT_THAT(s.message(), HasSubstr("block_vocab = 0"));
  s = HeadBlockGrad(kFake, static_cast<int32_t*>(kFake), 2, 8, -1, static_cast<float*>(kFake),
                    static_cast<float*>(kFake), 1.0f, kFake, kFakeStream);
  EXPECT_THAT(s.message(), HasSubstr("first_row = -1"));
  s = HeadBlockGrad(kFake, static_cast<int32_t*>(kFake), 2, 8, 0, static_cast<float*>(kFake),
                    static_cast<float*>(kFake), 1.0f, nullptr, kFakeStream);
  EXPECT_THAT(s.message(), HasSubstr("dlogits"));
  s = EmbeddingBackward(static_cast<int32_t*>(kFake), static_cast<int32_t*>(kFake),
                        static_cast<int32_t*>(kFake), 9, 4, kFake, 8, static_cast<float*>(kFake),
                        kFakeStream);
  EXPECT_THAT(s.message(), HasSubstr("unique_count = 9"));
}

TEST(OpsValidationTest, AttentionShapeChecks) {
  AttentionShape shape{1, 5, 6, 4, 64, 0.125f};
  absl::Status s =
      AttentionForward(shape, kFake, kFake, kFake, kFake, static_cast<float*>(kFake), kFakeStream);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("q_heads = 6"));
  shape = AttentionShape{1, 5, 4, 2, 96, 0.1f};
  s = AttentionForward(shape, kFake, kFake, kFake, kFake, static_cast<float*>(kFake), kFakeStream);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("head_dim = 96"));
  shape = AttentionShape{2, 5, 4, 2, 64, 0.125f};
  EXPECT_EQ(AttentionBackwardWorkspaceBytes(shape), 2u * 4u * 5u * sizeof(float));
  s = AttentionBackward(shape, kFake, kFake, kFake, kFake, kFake, static_cast<float*>(kFake), kFake,
                        kFake, kFake, kFake, 4, kFakeStream);
  EXPECT_THAT(s.message(), HasSubstr("workspace_bytes = 4"));
}

TEST(OpsValidationTest, EmptyWorkIsANoOp) {
  EXPECT_TRUE(ResidualAdd(nullptr, nullptr, nullptr, 0, kFakeStream).ok());
  EXPECT_TRUE(AccumulateFp32(nullptr, nullptr, 0, kFakeStream).ok());
  EXPECT_TRUE(SwigluForward(nullptr, nullptr, nullptr, 0, kFakeStream).ok());
  EXPECT_TRUE(RmsnormForward(nullptr, nullptr, 0, 8, 1e-5f, nullptr, nullptr, kFakeStream).ok());
}

// The harness: every CUDA op runs as cases of one parameterised test, each an op on one shape of
// odd sizes (and a degenerate one), compared with a double-precision reference computed here
// from the same bf16 inputs. Tolerances are stated at each comparison: one bf16 rounding of an
// fp32 result (kBf16Rel) for bf16 outputs, fp32 summation error for fp32 outputs.

// The sizes an op's case uses; each op reads the fields it needs.
struct OpShape {
  int64_t n = 0;           // elements (element-wise ops)
  int64_t rows = 0;        // tokens / rows
  int64_t cols = 0;        // row width: hidden dim, vocabulary
  int64_t block_rows = 0;  // vocabulary block (the blocked head); 0 = whole rows
  int batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
};

struct OpCase {
  std::string name;  // gtest parameter name: letters, digits and '_'
  OpShape shape;
  void (*check)(const OpShape&, TestStream&);
};

void CheckResidualAndSwiglu(const OpShape& shape, TestStream& stream) {
  const int64_t n = shape.n;
  const auto a = RandomBf16Values(n, 1, -4.0f, 4.0f);
  const auto b = RandomBf16Values(n, 2, -4.0f, 4.0f);
  const auto dy = RandomBf16Values(n, 3, -1.0f, 1.0f);
  DeviceBuffer<uint16_t> da(ToBf16(a)), db(ToBf16(b)), ddy(ToBf16(dy)), out(n), dg(n), du(n);
  ASSERT_TRUE(ResidualAdd(da.get(), db.get(), out.get(), n, stream.get()).ok());
  ASSERT_EQ(stream.Sync(), cudaSuccess);
  std::vector<double> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = double{a[i]} + b[i];
  ExpectClose(FromBf16(out.Download()), want, kBf16Rel, 1e-2, "residual");

  ASSERT_TRUE(SwigluForward(da.get(), db.get(), out.get(), n, stream.get()).ok());
  ASSERT_TRUE(
      SwigluBackward(da.get(), db.get(), ddy.get(), dg.get(), du.get(), n, stream.get()).ok());
  ASSERT_EQ(stream.Sync(), cudaSuccess);
  std::vector<double> want_y(n), want_dg(n), want_du(n);
  for (int64_t i = 0; i < n; ++i) {
    const double g = a[i], u = b[i], s = 1.0 / (1.0 + std::exp(-g));
    want_y[i] = g * s * u;
    want_du[i] = g * s * dy[i];
    want_dg[i] = u * dy[i] * (s + g * s * (1.0 - s));
  }
  ExpectClose(FromBf16(out.Download()), want_y, kBf16Rel, 1e-2, "swiglu y");
  ExpectClose(FromBf16(dg.Download()), want_dg, kBf16Rel, 1e-2, "swiglu d_gate");
  ExpectClose(FromBf16(du.Download()), want_du, kBf16Rel, 1e-2, "swiglu d_up");
}

// RoPE forward against the rotation in double; backward (the inverse rotation) restores x.
void CheckRope(const OpShape& shape, TestStream& stream) {
  const int seq = shape.seq, batch = shape.batch, heads = shape.heads, head_dim = shape.head_dim;
  const int half = head_dim / 2;
  const int64_t tokens = int64_t{seq} * batch, n = tokens * heads * head_dim;
  std::vector<float> cos_t(seq * half), sin_t(seq * half);
  std::vector<double> angle(seq * half);
  for (int p = 0; p < seq; ++p) {
    for (int i = 0; i < half; ++i) {
      angle[p * half + i] = p * RopeInverseFrequency(i, head_dim, 500000.0, RopeScaling{});
      cos_t[p * half + i] = static_cast<float>(std::cos(angle[p * half + i]));
      sin_t[p * half + i] = static_cast<float>(std::sin(angle[p * half + i]));
    }
  }
  const auto x = RandomBf16Values(n, 4, -2.0f, 2.0f);
  DeviceBuffer<uint16_t> dx(ToBf16(x));
  DeviceBuffer<float> dcos(cos_t), dsin(sin_t);
  ASSERT_TRUE(RopeInPlace(dx.get(), tokens, heads, head_dim, seq, dcos.get(), dsin.get(), false,
                          stream.get())
                  .ok());
  ASSERT_EQ(stream.Sync(), cudaSuccess);
  std::vector<double> want(n);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < half; ++i) {
        const int64_t lo = (t * heads + h) * head_dim + i;
        const double c = std::cos(angle[(t % seq) * half + i]);
        const double s = std::sin(angle[(t % seq) * half + i]);
        want[lo] = x[lo] * c - x[lo + half] * s;
        want[lo + half] = x[lo + half] * c + x[lo] * s;
      }
    }
  }
  ExpectClose(FromBf16(dx.Download()), want, kBf16Rel, 1e-2, "rope forward");
  ASSERT_TRUE(RopeInPlace(dx.get(), tokens, heads, head_dim, seq, dcos.get(), dsin.get(), true,
                          stream.get())
                  .ok());
  ASSERT_EQ(stream.Sync(), cudaSuccess);
  std::vector<double> original(x.begin(), x.end());
  ExpectClose(FromBf16(dx.Download()), original, 2 * kBf16Rel, 2e-2, "rope round trip");
}

// The gather is exact; the deterministic backward is bitwise reproducible and matches the
// double scatter-add.
void CheckEmbedding(const OpShape& shape, TestStream& stream) {
  const int64_t vocab = shape.cols, tokens = shape.rows;
  const int dim = shape.head_dim;
  std::vector<int32_t> ids(tokens);
  for (int64_t t = 0; t < tokens; ++t) ids[t] = static_cast<int32_t>((t * t * 7 + 3) % vocab);
  const auto table = RandomBf16Values(vocab * dim, 5, -1.0f, 1.0f);
  const auto dout = RandomBf16Values(tokens * dim, 6, -1.0f, 1.0f);
  DeviceBuffer<int32_t> dids(ids);
  DeviceBuffer<uint16_t> dtable(ToBf16(table)), dout_dev(ToBf16(dout)), out(tokens * dim);
  ASSERT_TRUE(
      EmbeddingForward(dids.get(), tokens, dtable.get(), vocab, dim, out.get(), stream.get()).ok());
  ASSERT_EQ(stream.Sync(), cudaSuccess);
  const auto gathered = FromBf16(out.Download());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int c = 0; c < dim; ++c) ASSERT_EQ(gathered[t * dim + c], table[ids[t] * dim + c]);
  }

  auto index = BuildEmbeddingGradIndex(ids, vocab);
  ASSERT_TRUE(index.ok());
  DeviceBuffer<int32_t> rows(index->unique_rows), offsets(index->segment_offsets),
      order(index->token_order);
  const std::vector<float> initial(vocab * dim, 0.25f);
  std::vector<std::vector<float>> results;
  for (int run = 0; run < 2; ++run) {
    DeviceBuffer<float> grad(initial);
    ASSERT_TRUE(EmbeddingBackward(rows.get(), offsets.get(), order.get(),
                                  static_cast<int64_t>(index->unique_rows.size()), tokens,
                                  dout_dev.get(), dim, grad.get(), stream.get())
                    .ok());
    ASSERT_EQ(stream.Sync(), cudaSuccess);
    results.push_back(grad.Download());
  }
  EXPECT_EQ(results[0], results[1]) << "embedding backward is not bitwise reproducible";
  std::vector<double> want(initial.begin(), initial.end());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int c = 0; c < dim; ++c) want[ids[t] * dim + c] += dout[t * dim + c];
  }
  // fp32 sums of <= a few dozen terms in [-1, 1].
  ExpectClose(results[0], want, 1e-5, 1e-5, "embedding dtable");
}

void CheckRmsnorm(const OpShape& shape, TestStream& stream) {
  const int64_t rows = shape.rows;
  const int dim = static_cast<int>(shape.cols);
  const float eps = 1e-5f;
  const auto x = RandomBf16Values(rows * dim, 7, -2.0f, 2.0f);
  const auto w = RandomBf16Values(dim, 8, 0.5f, 1.5f);
  const auto dy = RandomBf16Values(rows * dim, 9, -1.0f, 1.0f);
  const auto dx_prior = RandomBf16Values(rows * dim, 10, -1.0f, 1.0f);
  DeviceBuffer<uint16_t> dxin(ToBf16(x)), dw_in(ToBf16(w)), ddy(ToBf16(dy)), y(rows * dim),
      dx(ToBf16(dx_prior));
  DeviceBuffer<float> rstd(rows), dw(std::vector<float>(dim, 0.0f));
  DeviceBuffer<float> workspace(RmsnormBackwardWorkspaceFloats(rows, dim));
  ASSERT_TRUE(
      RmsnormForward(dxin.get(), dw_in.get(), rows, dim, eps, y.get(), rstd.get(), stream.get())
          .ok());
  ASSERT_TRUE(RmsnormBackward(dxin.get(), dw_in.get(), rstd.get(), ddy.get(), rows, dim,
                              /*accumulate_dx=*/true, dx.get(), dw.get(), workspace.get(),
                              RmsnormBackwardWorkspaceFloats(rows, dim), stream.get())
                  .ok());
  ASSERT_EQ(stream.Sync(), cudaSuccess);

  std::vector<double> want_y(rows * dim), want_rstd(rows), want_dx(rows * dim), want_dw(dim, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0.0, dot = 0.0;
    for (int c = 0; c < dim; ++c) {
      ss += double{x[r * dim + c]} * x[r * dim + c];
      dot += double{w[c]} * dy[r * dim + c] * x[r * dim + c];
    }
    const double rs = 1.0 / std::sqrt(ss / dim + eps);
    want_rstd[r] = rs;
    for (int c = 0; c < dim; ++c) {
      const int64_t i = r * dim + c;
      want_y[i] = x[i] * rs * w[c];
      want_dx[i] = dx_prior[i] + rs * (w[c] * dy[i] - x[i] * rs * rs * dot / dim);
      want_dw[c] += dy[i] * x[i] * rs;
    }
  }
  ExpectClose(rstd.Download(), want_rstd, 1e-5, 0.0, "rstd");
  ExpectClose(FromBf16(y.Download()), want_y, kBf16Rel, 1e-2, "rmsnorm y");
  ExpectClose(FromBf16(dx.Download()), want_dx, kBf16Rel, 2e-2, "rmsnorm dx");
  ExpectClose(dw.Download(), want_dw, 1e-4, 1e-3, "rmsnorm dw");
}

// Cross-entropy of logits rows in double: per-row loss, their sum, dlogits.
struct CrossEntropyReference {
  std::vector<double> loss, grad;
  double sum = 0.0;
};

CrossEntropyReference ReferenceCrossEntropy(const std::vector<float>& logits,
                                            const std::vector<int32_t>& targets, int64_t vocab,
                                            float scale) {
  const int64_t rows = static_cast<int64_t>(targets.size());
  CrossEntropyReference ref;
  ref.loss.assign(rows, 0.0);
  ref.grad.assign(rows * vocab, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] < 0) continue;
    double mx = -INFINITY;
    for (int64_t c = 0; c < vocab; ++c) mx = std::max(mx, double{logits[r * vocab + c]});
    double se = 0.0;
    for (int64_t c = 0; c < vocab; ++c) se += std::exp(logits[r * vocab + c] - mx);
    const double lse = mx + std::log(se);
    ref.loss[r] = lse - logits[r * vocab + targets[r]];
    ref.sum += ref.loss[r];
    for (int64_t c = 0; c < vocab; ++c) {
      ref.grad[r * vocab + c] =
          (std::exp(logits[r * vocab + c] - lse) - (c == targets[r] ? 1.0 : 0.0)) * scale;
    }
  }
  return ref;
}

// Targets spread over the vocabulary, two ignored (-100, -1) and one in the last (short) block.
std::vector<int32_t> CrossEntropyTargets(int64_t rows, int64_t vocab) {
  std::vector<int32_t> targets(rows);
  for (int64_t r = 0; r < rows; ++r) targets[r] = static_cast<int32_t>((r * 7919) % vocab);
  if (rows > 4) targets[4] = -100;
  if (rows > 11) targets[11] = -1;
  if (rows > 7) targets[7] = static_cast<int32_t>(vocab - 1);
  return targets;
}

// Whole rows: loss, its sum (bitwise reproducible) and dlogits.
void CheckCrossEntropy(const OpShape& shape, TestStream& stream) {
  const int64_t rows = shape.rows, vocab = shape.cols;
  const float scale = 1.0f / 17.0f;
  const auto logits = RandomBf16Values(rows * vocab, 11, -8.0f, 8.0f);
  const std::vector<int32_t> targets = CrossEntropyTargets(rows, vocab);
  DeviceBuffer<uint16_t> dlogits_in(ToBf16(logits)), dlogits(rows * vocab);
  DeviceBuffer<int32_t> dtargets(targets);
  DeviceBuffer<float> row_loss(rows), loss_sum(1);
  std::vector<float> sums;
  for (int run = 0; run < 2; ++run) {
    ASSERT_TRUE(CrossEntropy(dlogits_in.get(), dtargets.get(), rows, vocab, scale, dlogits.get(),
                             row_loss.get(), loss_sum.get(), stream.get())
                    .ok());
    ASSERT_EQ(stream.Sync(), cudaSuccess);
    sums.push_back(loss_sum.Download()[0]);
  }
  EXPECT_EQ(sums[0], sums[1]) << "loss sum is not bitwise reproducible";
  const CrossEntropyReference want = ReferenceCrossEntropy(logits, targets, vocab, scale);
  ExpectClose(row_loss.Download(), want.loss, 1e-5, 1e-5, "row loss");
  EXPECT_NEAR(sums[0], want.sum, 1e-5 * std::abs(want.sum) + 1e-5);
  // Gradient entries are tiny except at the target; absolute bound relative to scale.
  ExpectClose(FromBf16(dlogits.Download()), want.grad, kBf16Rel, 1e-4 * scale, "dlogits");
}

// The same rows in vocabulary blocks of shape.block_rows (the last one short): the running
// states, the loss from them and each block's dlogits, against the whole rows in double.
void CheckCrossEntropyInBlocks(const OpShape& shape, TestStream& stream) {
  const int64_t rows = shape.rows, vocab = shape.cols, block_rows = shape.block_rows;
  const float scale = 1.0f / 17.0f;
  const auto logits = RandomBf16Values(rows * vocab, 11, -8.0f, 8.0f);
  const std::vector<int32_t> targets = CrossEntropyTargets(rows, vocab);
  const CrossEntropyReference want = ReferenceCrossEntropy(logits, targets, vocab, scale);
  DeviceBuffer<int32_t> dtargets(targets);
  DeviceBuffer<float> row_max(rows), row_sum(rows), target_logit(rows), row_loss(rows),
      loss_sum(1);
  ASSERT_TRUE(
      HeadStatsReset(rows, row_max.get(), row_sum.get(), target_logit.get(), stream.get()).ok());
  std::vector<std::vector<float>> blocks;
  for (int64_t first = 0; first < vocab; first += block_rows) {
    const int64_t n = std::min(block_rows, vocab - first);
    std::vector<float> block(rows * n);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < n; ++c) block[r * n + c] = logits[r * vocab + first + c];
    }
    DeviceBuffer<uint16_t> dblock(ToBf16(block));
    ASSERT_TRUE(HeadBlockStats(dblock.get(), dtargets.get(), rows, n, first, row_max.get(),
                               row_sum.get(), target_logit.get(), stream.get())
                    .ok());
    ASSERT_EQ(stream.Sync(), cudaSuccess);
    blocks.push_back(std::move(block));
  }
  ASSERT_TRUE(HeadLossFromStats(row_max.get(), row_sum.get(), target_logit.get(), dtargets.get(),
                                rows, row_loss.get(), loss_sum.get(), stream.get())
                  .ok());
  ASSERT_EQ(stream.Sync(), cudaSuccess);
  ExpectClose(row_loss.Download(), want.loss, 1e-5, 1e-5, "row loss");
  EXPECT_NEAR(loss_sum.Download()[0], want.sum, 1e-5 * std::abs(want.sum) + 1e-5);
  for (size_t b = 0; b < blocks.size(); ++b) {
    const int64_t first = static_cast<int64_t>(b) * block_rows;
    const int64_t n = std::min(block_rows, vocab - first);
    DeviceBuffer<uint16_t> dblock(ToBf16(blocks[b]));
    ASSERT_TRUE(HeadBlockGrad(dblock.get(), dtargets.get(), rows, n, first, row_max.get(),
                              row_sum.get(), scale, dblock.get(), stream.get())
                    .ok());
    ASSERT_EQ(stream.Sync(), cudaSuccess);
    std::vector<double> want_block(rows * n);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < n; ++c) want_block[r * n + c] = want.grad[r * vocab + first + c];
    }
    ExpectClose(FromBf16(dblock.Download()), want_block, kBf16Rel, 1e-4 * scale,
                "block dlogits");
  }
}

// Exact: the host's round-to-nearest-even of the same fp32 values.
void CheckRoundToBf16(const OpShape& shape, TestStream& stream) {
  const int64_t n = shape.n;
  std::vector<float> in(n);
  for (int64_t i = 0; i < n; ++i) {
    in[i] = std::ldexp(1.0f + static_cast<float>(i) / 4099.0f, static_cast<int>(i % 9) - 4);
  }
  DeviceBuffer<float> din(in);
  DeviceBuffer<uint16_t> out(n);
  ASSERT_TRUE(RoundToBf16(din.get(), out.get(), n, stream.get()).ok());
  ASSERT_EQ(stream.Sync(), cudaSuccess);
  EXPECT_EQ(out.Download(), ToBf16(in)) << n;
}

// Exact: the host's fp32 add of the same values (the executor accumulates gradients on either
// side and must get the same bits); and within one fp32 rounding of the double sum.
void CheckAccumulateFp32(const OpShape& shape, TestStream& stream) {
  const int64_t n = shape.n;
  std::vector<float> g(n), sum(n);
  for (int64_t i = 0; i < n; ++i) {
    g[i] = std::ldexp(1.0f + static_cast<float>(i % 977) / 977.0f, static_cast<int>(i % 13) - 6) *
           (i % 3 == 0 ? -1.0f : 1.0f);
    sum[i] = std::ldexp(1.0f + static_cast<float>(i % 541) / 541.0f, static_cast<int>(i % 7) - 3);
  }
  if (n > 1) {
    g[0] = -0.0f;
    sum[0] = -0.0f;
    g[1] = 1e-40f;  // subnormals survive: no flush to zero
    sum[1] = -3e-40f;
  }
  DeviceBuffer<float> dg(g), dsum(sum);
  ASSERT_TRUE(AccumulateFp32(dg.get(), dsum.get(), n, stream.get()).ok());
  ASSERT_EQ(stream.Sync(), cudaSuccess);
  const std::vector<float> got = dsum.Download();
  std::vector<double> want(n);
  for (int64_t i = 0; i < n; ++i) {
    const float host = sum[i] + g[i];
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(host)) << i;
    want[i] = double{sum[i]} + g[i];
  }
  ExpectClose(got, want, 0x1p-24, 1e-45, "accumulate");
}

// The double-precision reference (kernels/cuda/testing/attention_reference.h) of an ops.h
// shape; with segment ids [batch, seq] (empty = none) a key is visible only in the query's
// segment.
testing::AttentionReferenceResult ReferenceAttention(const AttentionShape& s,
                                                     const std::vector<float>& q,
                                                     const std::vector<float>& k,
                                                     const std::vector<float>& v,
                                                     const std::vector<float>& dout,
                                                     const std::vector<int32_t>& segments = {}) {
  return testing::ReferenceAttention(
      testing::AttentionReferenceShape{s.batch, s.seq, s.q_heads, s.kv_heads, s.head_dim,
                                       s.softmax_scale},
      q, k, v, dout, segments);
}

void CheckAttention(const OpShape& shape, TestStream& stream) {
  const int head_dim = shape.head_dim;
  const AttentionShape s{shape.batch, shape.seq, shape.heads, shape.kv_heads, head_dim,
                         1.0f / std::sqrt(static_cast<float>(head_dim))};
  const size_t tokens = size_t(s.batch) * s.seq;
  const size_t nq = tokens * s.q_heads * head_dim, nk = tokens * s.kv_heads * head_dim;
  const auto q = RandomBf16Values(nq, 12, -1.0f, 1.0f);
  const auto k = RandomBf16Values(nk, 13, -1.0f, 1.0f);
  const auto v = RandomBf16Values(nk, 14, -1.0f, 1.0f);
  const auto dout = RandomBf16Values(nq, 15, -1.0f, 1.0f);
  DeviceBuffer<uint16_t> dq_in(ToBf16(q)), dk_in(ToBf16(k)), dv_in(ToBf16(v)),
      ddout(ToBf16(dout)), out(nq), dq(nq), dk(nk), dv(nk);
  DeviceBuffer<float> lse(size_t(s.batch) * s.q_heads * s.seq);
  DeviceBuffer<uint8_t> workspace(AttentionBackwardWorkspaceBytes(s));
  ASSERT_TRUE(AttentionForward(s, dq_in.get(), dk_in.get(), dv_in.get(), out.get(), lse.get(),
                               stream.get())
                  .ok());
  std::vector<std::vector<uint16_t>> dk_runs;
  for (int run = 0; run < 2; ++run) {
    ASSERT_TRUE(AttentionBackward(s, dq_in.get(), dk_in.get(), dv_in.get(), out.get(),
                                  ddout.get(), lse.get(), dq.get(), dk.get(), dv.get(),
                                  workspace.get(), AttentionBackwardWorkspaceBytes(s),
                                  stream.get())
                    .ok());
    ASSERT_EQ(stream.Sync(), cudaSuccess);
    dk_runs.push_back(dk.Download());
  }
  EXPECT_EQ(dk_runs[0], dk_runs[1]) << "attention dk is not bitwise reproducible";
  const testing::AttentionReferenceResult ref = ReferenceAttention(s, q, k, v, dout);
  ExpectClose(FromBf16(out.Download()), ref.out, kBf16Rel, 1e-2, "attention out");
  ExpectClose(lse.Download(), ref.lse, 1e-5, 1e-4, "attention lse");
  // Gradients accumulate over up to seq * group terms from bf16 inputs (and
  // the bf16-rounded forward output enters delta): looser absolute term.
  ExpectClose(FromBf16(dq.Download()), ref.dq, 2e-2, 2e-2, "attention dq");
  ExpectClose(FromBf16(dk.Download()), ref.dk, 2e-2, 2e-2, "attention dk");
  ExpectClose(FromBf16(dv.Download()), ref.dv, 2e-2, 2e-2, "attention dv");
}

// Packed samples: segment ids [2, 67] (row 0: samples of 20, 1, 30 and 16 tokens, so blocks and
// tiles straddle sample starts; row 1: 40 tokens then 27 of padding) against the double
// reference with the same visibility, and each sample of row 0 against itself run alone.
void CheckAttentionWithSegments(const OpShape& shape, TestStream& stream) {
  const int head_dim = shape.head_dim;
  AttentionShape s{shape.batch, shape.seq, shape.heads, shape.kv_heads, head_dim,
                   1.0f / std::sqrt(static_cast<float>(head_dim))};
  ASSERT_EQ(s.batch, 2);
  ASSERT_EQ(s.seq, 67);
  const std::vector<std::vector<int>> lengths = {{20, 1, 30, 16}, {40, 27}};
  std::vector<int32_t> segments;
  for (const std::vector<int>& row : lengths) {
    for (size_t k = 0; k < row.size(); ++k) segments.insert(segments.end(), row[k], int32_t(k));
  }
  const size_t tokens = size_t(s.batch) * s.seq;
  const size_t nq = tokens * s.q_heads * head_dim, nk = tokens * s.kv_heads * head_dim;
  const auto q = RandomBf16Values(nq, 22, -1.0f, 1.0f);
  const auto k = RandomBf16Values(nk, 23, -1.0f, 1.0f);
  const auto v = RandomBf16Values(nk, 24, -1.0f, 1.0f);
  const auto dout = RandomBf16Values(nq, 25, -1.0f, 1.0f);
  struct Run {
    std::vector<float> out, lse, dq, dk, dv;
  };
  // Forward and backward of `a` on the device, with segment ids when `seg` is not empty.
  auto run = [&](const AttentionShape& a, const std::vector<float>& hq,
                 const std::vector<float>& hk, const std::vector<float>& hv,
                 const std::vector<float>& hdout, const std::vector<int32_t>& seg) {
    const size_t t = size_t(a.batch) * a.seq;
    DeviceBuffer<uint16_t> dq_in(ToBf16(hq)), dk_in(ToBf16(hk)), dv_in(ToBf16(hv)),
        ddout(ToBf16(hdout)), out(hq.size()), dq(hq.size()), dk(hk.size()), dv(hk.size());
    DeviceBuffer<float> lse(t * a.q_heads);
    DeviceBuffer<int32_t> dseg(seg.empty() ? std::vector<int32_t>(1, 0) : seg);
    AttentionShape with = a;
    with.segments = seg.empty() ? nullptr : dseg.get();
    DeviceBuffer<uint8_t> workspace(AttentionBackwardWorkspaceBytes(with));
    EXPECT_TRUE(AttentionForward(with, dq_in.get(), dk_in.get(), dv_in.get(), out.get(), lse.get(),
                                 stream.get())
                    .ok());
    EXPECT_TRUE(AttentionBackward(with, dq_in.get(), dk_in.get(), dv_in.get(), out.get(),
                                  ddout.get(), lse.get(), dq.get(), dk.get(), dv.get(),
                                  workspace.get(), AttentionBackwardWorkspaceBytes(with),
                                  stream.get())
                    .ok());
    EXPECT_EQ(stream.Sync(), cudaSuccess);
    return Run{FromBf16(out.Download()), lse.Download(), FromBf16(dq.Download()),
               FromBf16(dk.Download()), FromBf16(dv.Download())};
  };
  const Run packed = run(s, q, k, v, dout, segments);
  const testing::AttentionReferenceResult ref = ReferenceAttention(s, q, k, v, dout, segments);
  ExpectClose(packed.out, ref.out, kBf16Rel, 1e-2, "segment attention out");
  ExpectClose(packed.lse, ref.lse, 1e-5, 1e-4, "segment attention lse");
  ExpectClose(packed.dq, ref.dq, 2e-2, 2e-2, "segment attention dq");
  ExpectClose(packed.dk, ref.dk, 2e-2, 2e-2, "segment attention dk");
  ExpectClose(packed.dv, ref.dv, 2e-2, 2e-2, "segment attention dv");
  // Each sample of row 0 alone: the same values up to bf16 rounding of the outputs (the fp32
  // sums run over the same visible keys, in other tiles).
  const int qw = s.q_heads * head_dim, kw = s.kv_heads * head_dim;
  auto slice = [](const std::vector<float>& x, int width, int first, int count) {
    return std::vector<float>(x.begin() + int64_t{first} * width,
                              x.begin() + int64_t{first + count} * width);
  };
  auto to_double = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
  int first = 0;
  for (int length : lengths[0]) {
    AttentionShape alone = s;
    alone.batch = 1;
    alone.seq = length;
    const Run r = run(alone, slice(q, qw, first, length), slice(k, kw, first, length),
                      slice(v, kw, first, length), slice(dout, qw, first, length), {});
    const std::string what = "sample at " + std::to_string(first);
    ExpectClose(slice(packed.out, qw, first, length), to_double(r.out), kBf16Rel, 1e-2,
                ("out of the " + what).c_str());
    ExpectClose(slice(packed.dq, qw, first, length), to_double(r.dq), 2e-2, 2e-2,
                ("dq of the " + what).c_str());
    ExpectClose(slice(packed.dk, kw, first, length), to_double(r.dk), 2e-2, 2e-2,
                ("dk of the " + what).c_str());
    ExpectClose(slice(packed.dv, kw, first, length), to_double(r.dv), 2e-2, 2e-2,
                ("dv of the " + what).c_str());
    first += length;
  }
}

OpShape Elements(int64_t n) {
  OpShape s;
  s.n = n;
  return s;
}

OpShape Rows(int64_t rows, int64_t cols, int64_t block_rows = 0) {
  OpShape s;
  s.rows = rows;
  s.cols = cols;
  s.block_rows = block_rows;
  return s;
}

OpShape Heads(int batch, int seq, int heads, int kv_heads, int head_dim) {
  OpShape s;
  s.batch = batch;
  s.seq = seq;
  s.heads = heads;
  s.kv_heads = kv_heads;
  s.head_dim = head_dim;
  return s;
}

OpShape EmbeddingShape(int64_t vocab, int64_t tokens, int dim) {
  OpShape s = Rows(tokens, vocab);
  s.head_dim = dim;
  return s;
}

// Every op, on odd sizes that leave partial blocks, warps and vectors, and on a degenerate one.
std::vector<OpCase> AllOpCases() {
  return {
      {"ResidualSwiglu_1", Elements(1), CheckResidualAndSwiglu},
      {"ResidualSwiglu_4099", Elements(4099), CheckResidualAndSwiglu},
      {"ResidualSwiglu_1000003", Elements(1000003), CheckResidualAndSwiglu},
      {"Rope_s13_b3_h5_d70", Heads(3, 13, 5, 5, 70), CheckRope},
      {"Rope_s1_b1_h1_d2", Heads(1, 1, 1, 1, 2), CheckRope},
      {"Embedding_v101_t333_d257", EmbeddingShape(101, 333, 257), CheckEmbedding},
      {"Embedding_v7_t1_d1", EmbeddingShape(7, 1, 1), CheckEmbedding},
      {"Rmsnorm_r37_d1031", Rows(37, 1031), CheckRmsnorm},
      {"Rmsnorm_r1_d3", Rows(1, 3), CheckRmsnorm},
      {"CrossEntropy_r19_v32003", Rows(19, 32003), CheckCrossEntropy},
      {"CrossEntropy_r3_v5", Rows(3, 5), CheckCrossEntropy},
      {"HeadBlocks_r19_v32003_b7001", Rows(19, 32003, 7001), CheckCrossEntropyInBlocks},
      {"HeadBlocks_r13_v997_b1", Rows(13, 997, 1), CheckCrossEntropyInBlocks},
      {"RoundToBf16_1", Elements(1), CheckRoundToBf16},
      {"RoundToBf16_4099", Elements(4099), CheckRoundToBf16},
      {"AccumulateFp32_1", Elements(1), CheckAccumulateFp32},
      {"AccumulateFp32_1000003", Elements(1000003), CheckAccumulateFp32},
      {"Attention_b2_s67_h4_kv2_d64", Heads(2, 67, 4, 2, 64), CheckAttention},
      {"Attention_b2_s67_h4_kv2_d128", Heads(2, 67, 4, 2, 128), CheckAttention},
      {"Attention_b1_s1_h3_kv1_d64", Heads(1, 1, 3, 1, 64), CheckAttention},
      {"AttentionSegments_b2_s67_h4_kv2_d64", Heads(2, 67, 4, 2, 64), CheckAttentionWithSegments},
      {"AttentionSegments_b2_s67_h4_kv2_d128", Heads(2, 67, 4, 2, 128),
       CheckAttentionWithSegments},
  };
}

class CudaOpHarness : public ::testing::TestWithParam<OpCase> {
 protected:
  void SetUp() override { MT_SKIP_WITHOUT_CUDA(); }
};

TEST_P(CudaOpHarness, MatchesTheDoubleReference) {
  TestStream stream;
  GetParam().check(GetParam().shape, stream);
}

INSTANTIATE_TEST_SUITE_P(AllOps, CudaOpHarness, ::testing::ValuesIn(AllOpCases()),
                         [](const ::testing::TestParamInfo<OpCase>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace megatrain::kernels::cuda
