// CudaLayerMath against the CPU layer math on the same bf16-representable
// inputs: a tiny odd-sized GQA layer (d = 99, F = 75, 4:2 heads, 2 sequences
// of 13 tokens) with no biases, q/k/v biases (Qwen2), every bias and Qwen3's
// per-head q/k norms (q width 256 != d), then the head and the embedding. Needs a GPU: skips with "no CUDA device: ..." here.
#include "engine/exec/cuda_layer_math.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "engine/exec/activation_sets.h"
#include "engine/exec/cpu_layer_math.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/embedding_grad_index.h"

namespace megatrain::engine {
namespace {

using kernels::cuda::testing::DeviceBuffer;
using kernels::cuda::testing::FromBf16;
using kernels::cuda::testing::RandomBf16Values;
using kernels::cuda::testing::TestStream;
using kernels::cuda::testing::ToBf16;
using bf16 = __nv_bfloat16;

using kernels::cuda::testing::ExpectCloseToMax;
constexpr double kForwardTolerance = kernels::cuda::testing::kLayerForwardTolerance;
constexpr double kGradientTolerance = kernels::cuda::testing::kLayerGradientTolerance;
constexpr double kLossTolerance = kernels::cuda::testing::kLayerLossTolerance;

ModelDims TestDims() {
  ModelDims m;
  m.vocab = 37;
  m.hidden = 99;  // not a multiple of 8: row starts are only 2-byte aligned
  m.ffn = 75;
  m.q_heads = 4;
  m.kv_heads = 2;   // GQA 2:1
  m.head_dim = 64;  // the smallest the CUDA attention supports
  m.num_layers = 1;
  m.rms_eps = 1e-5f;
  m.batch = 2;
  m.seq = 13;
  m.head_chunk = 7;  // 26 tokens: chunks 7, 7, 7, 5
  return m;
}

// kQkNorm: no biases, Qwen3's per-head q/k RMSNorm (dims.qk_norm).
enum class Biases { kNone, kQkv, kAll, kQkNorm };

std::string BiasName(Biases b) {
  switch (b) {
    case Biases::kNone:
      return "NoBias";
    case Biases::kQkv:
      return "QkvBias";
    case Biases::kAll:
      return "AllBiases";
    case Biases::kQkNorm:
      return "QkNorm";
  }
  return "?";
}

// One packed tensor of the layer: where it sits, how many elements, how to fill it.
struct Slot {
  const char* name;
  int64_t* offset;
  int64_t count;
  int64_t fan_in;  // 0: a norm (values near 1) or a bias (small values)
  bool norm;
};

// Offsets packed like ParameterLayout does (each tensor 16-element aligned).
int64_t PackLayer(const ModelDims& m, Biases biases, LayerOffsets& o, std::vector<Slot>& slots) {
  const int64_t d = m.hidden;
  const bool qkv = biases == Biases::kQkv || biases == Biases::kAll;
  const bool all = biases == Biases::kAll;
  const int64_t head_norm = m.qk_norm ? m.head_dim : 0;
  slots = {{"input_norm", &o.input_norm, d, 0, true},
           {"q", &o.q, m.q_width() * d, d, false},
           {"q_bias", &o.q_bias, qkv ? m.q_width() : 0, 0, false},
           {"q_norm", &o.q_norm, head_norm, 0, true},
           {"k", &o.k, m.kv_width() * d, d, false},
           {"k_bias", &o.k_bias, qkv ? m.kv_width() : 0, 0, false},
           {"k_norm", &o.k_norm, head_norm, 0, true},
           {"v", &o.v, m.kv_width() * d, d, false},
           {"v_bias", &o.v_bias, qkv ? m.kv_width() : 0, 0, false},
           {"o", &o.o, d * m.q_width(), m.q_width(), false},
           {"o_bias", &o.o_bias, all ? d : 0, 0, false},
           {"post_norm", &o.post_norm, d, 0, true},
           {"gate", &o.gate, m.ffn * d, d, false},
           {"gate_bias", &o.gate_bias, all ? m.ffn : 0, 0, false},
           {"up", &o.up, m.ffn * d, d, false},
           {"up_bias", &o.up_bias, all ? m.ffn : 0, 0, false},
           {"down", &o.down, d * m.ffn, m.ffn, false},
           {"down_bias", &o.down_bias, all ? d : 0, 0, false}};
  int64_t at = 0;
  for (Slot& s : slots) {
    if (s.count == 0) {
      *s.offset = -1;
      continue;
    }
    *s.offset = at;
    at += (s.count + 15) / 16 * 16;
  }
  return at;
}

// bf16-representable weights; q and k scaled so the attention scores are
// O(1) (a nearly uniform softmax would hide a wrong mapping).
std::vector<float> RandomLayer(int64_t total, const std::vector<Slot>& slots) {
  std::vector<float> w(static_cast<size_t>(total), 0.0f);
  uint32_t seed = 100;
  for (const Slot& s : slots) {
    if (s.count == 0) continue;
    const bool qk = std::string(s.name) == "q" || std::string(s.name) == "k";
    float lo = -0.1f, hi = 0.1f;  // biases
    if (s.norm) {
      lo = 0.8f;
      hi = 1.2f;
    } else if (s.fan_in > 0) {
      hi = (qk ? 1.7f : 1.0f) / std::sqrt(static_cast<float>(s.fan_in));
      lo = -hi;
    }
    const std::vector<float> v = RandomBf16Values(static_cast<size_t>(s.count), ++seed, lo, hi);
    std::copy(v.begin(), v.end(), w.begin() + *s.offset);
  }
  return w;
}

std::vector<uint16_t> Bf16Bits(const std::vector<float>& v) { return ToBf16(v); }

kernels::cpu::RopeTable TestRope(const ModelDims& m) {
  // llama3 scaling with a short original context, so every branch of the
  // inverse-frequency warp is taken over these 64-dim heads.
  kernels::RopeScaling scaling;
  scaling.factor = 8.0;
  scaling.low_freq_factor = 1.0;
  scaling.high_freq_factor = 4.0;
  scaling.original_max_position_embeddings = 64.0;
  auto table = kernels::cpu::RopeTable::Create(m.seq, m.head_dim, 500000.0, scaling);
  EXPECT_TRUE(table.ok()) << table.status();
  return std::move(*table);
}

template <class T>
T* As(const DeviceBuffer<uint8_t>& b) {
  return reinterpret_cast<T*>(b.get());
}

// (biases, cuDNN attention allowed): the layer against the CPU layer with
// whichever attention Create picks, and with our kernel forced.
class CudaLayerMathLayerTest : public ::testing::TestWithParam<std::tuple<Biases, bool>> {
 protected:
  void SetUp() override { MT_SKIP_WITHOUT_CUDA(); }
};

TEST_P(CudaLayerMathLayerTest, ForwardAndBackwardMatchTheCpuLayer) {
  ModelDims m = TestDims();
  m.qk_norm = std::get<0>(GetParam()) == Biases::kQkNorm;
  const int64_t n = m.tokens();
  const int64_t d = m.hidden;
  LayerOffsets offsets;
  std::vector<Slot> slots;
  const int64_t total = PackLayer(m, std::get<0>(GetParam()), offsets, slots);
  CudaLayerMathOptions options;
  options.cudnn_attention = std::get<1>(GetParam());
  const std::vector<float> w = RandomLayer(total, slots);
  const std::vector<float> x_in = RandomBf16Values(n * d, 7, -1.0f, 1.0f);
  const std::vector<float> dx_out = RandomBf16Values(n * d, 8, -1.0f, 1.0f);
  const kernels::cpu::RopeTable rope = TestRope(m);

  // CPU reference on the same (bf16-representable) values in fp32.
  std::vector<int32_t> positions(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) positions[t] = static_cast<int32_t>(t % m.seq);
  std::vector<float> attention_ws(AttentionWorkspaceFloats(m));
  const LayerContext ctx{&m, &offsets, &rope, positions.data(), attention_ws.data(), nullptr};
  std::vector<float> cpu_act_mem(LayerActivations::Bytes(m) / sizeof(float));
  std::vector<float> cpu_scratch_mem(LayerBackwardScratch::Bytes(m) / sizeof(float));
  LayerActivations cpu_act = LayerActivations::Carve(m, cpu_act_mem.data());
  LayerBackwardScratch cpu_scratch = LayerBackwardScratch::Carve(m, cpu_scratch_mem.data());
  std::vector<float> want_x_out(n * d), want_dx_in(n * d), want_grads(total, 0.0f);
  CpuLayerForward(ctx, w.data(), x_in.data(), cpu_act, want_x_out.data());
  CpuLayerBackward(ctx, w.data(), cpu_act, cpu_scratch, dx_out.data(), want_dx_in.data(),
                   want_grads.data());

  // CUDA: every buffer carved like the executor would, from 256-aligned blocks.
  TestStream stream;
  DeviceBuffer<uint8_t> tables(CudaLayerMath::TablesBytes(m));
  auto created = CudaLayerMath::Create(m, offsets, rope, tables.get(), stream.get(), options);
  ASSERT_TRUE(created.ok()) << created.status();
  CudaLayerMath math = std::move(*created);  // exercises the move
  if (!options.cudnn_attention) {
    EXPECT_EQ(math.attention_impl(), kernels::cuda::AttentionImpl::kOwnKernel);
  }
  std::printf("attention: %s: %s\n", kernels::cuda::AttentionImplName(math.attention_impl()),
              math.attention_reason().c_str());
  DeviceBuffer<uint8_t> act_mem(CudaActivations::Bytes(m));
  DeviceBuffer<uint8_t> scratch_mem(CudaBackwardScratch::Bytes(m));
  CudaActivations act = CudaActivations::Carve(m, act_mem.get());
  CudaBackwardScratch scratch = CudaBackwardScratch::Carve(m, scratch_mem.get());
  DeviceBuffer<uint16_t> dev_w(Bf16Bits(w)), dev_x_in(Bf16Bits(x_in)), dev_dx_out(Bf16Bits(dx_out)),
      dev_x_out(n * d), dev_dx_in(n * d);
  // Gradients start from a nonzero prior: backward must add, not overwrite.
  const std::vector<float> prior = RandomBf16Values(total, 9, -0.5f, 0.5f);
  DeviceBuffer<float> dev_grads(prior);

  const auto* wp = reinterpret_cast<const bf16*>(dev_w.get());
  ASSERT_TRUE(math.LayerForward(wp, reinterpret_cast<const bf16*>(dev_x_in.get()), act,
                                reinterpret_cast<bf16*>(dev_x_out.get()), stream.get())
                  .ok());
  ASSERT_TRUE(math.LayerBackward(wp, act, scratch, reinterpret_cast<const bf16*>(dev_dx_out.get()),
                                 reinterpret_cast<bf16*>(dev_dx_in.get()), dev_grads.get(),
                                 stream.get())
                  .ok());
  ASSERT_EQ(stream.Sync(), cudaSuccess);

  ExpectCloseToMax(FromBf16(dev_x_out.Download()), want_x_out, kForwardTolerance, "x_out");
  std::vector<uint16_t> saved(static_cast<size_t>(n * m.q_width()));
  ASSERT_EQ(
      cudaMemcpy(saved.data(), act.attn, saved.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost),
      cudaSuccess);
  ExpectCloseToMax(FromBf16(saved), std::vector<float>(cpu_act.attn, cpu_act.attn + saved.size()),
                   kForwardTolerance, "saved attention output");
  ExpectCloseToMax(FromBf16(dev_dx_in.Download()), want_dx_in, kGradientTolerance, "dx_in");

  std::vector<float> grads = dev_grads.Download();
  for (size_t i = 0; i < grads.size(); ++i) grads[i] -= prior[i];
  for (const Slot& s : slots) {
    if (s.count == 0) continue;
    ExpectCloseToMax(grads.data() + *s.offset, want_grads.data() + *s.offset, s.count,
                     kGradientTolerance, std::string("grad ") + s.name);
  }
}

INSTANTIATE_TEST_SUITE_P(Biases, CudaLayerMathLayerTest,
                         ::testing::Combine(::testing::Values(Biases::kNone, Biases::kQkv,
                                                              Biases::kAll, Biases::kQkNorm),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<Biases, bool>>& info) {
                           return std::string(BiasName(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_cudnn" : "_own_kernel");
                         });

class CudaLayerMathHeadTest : public ::testing::Test {
 protected:
  void SetUp() override { MT_SKIP_WITHOUT_CUDA(); }
};

// The head against the CPU head with the same vocabulary blocks: one block,
// and odd blocks with a short last one.
class CudaLayerMathHeadBlocksTest : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override { MT_SKIP_WITHOUT_CUDA(); }
};

INSTANTIATE_TEST_SUITE_P(BlockRows, CudaLayerMathHeadBlocksTest, ::testing::Values(0, 13));

TEST_P(CudaLayerMathHeadBlocksTest, HeadMatchesTheCpuHead) {
  ModelDims m = TestDims();
  m.head_block_rows = GetParam();
  const int64_t n = m.tokens();
  const int64_t d = m.hidden;
  const std::vector<float> final_norm = RandomBf16Values(d, 20, 0.8f, 1.2f);
  const std::vector<float> lm_head =
      RandomBf16Values(m.vocab * d, 21, -3.0f / std::sqrt(99.0f), 3.0f / std::sqrt(99.0f));
  const std::vector<float> x_final = RandomBf16Values(n * d, 22, -2.0f, 2.0f);
  std::vector<int32_t> targets(static_cast<size_t>(n));
  int64_t valid = 0;
  for (int64_t t = 0; t < n; ++t) {
    targets[t] = t % 5 == 3 ? -1 : static_cast<int32_t>((t * 11 + 3) % m.vocab);  // 20% ignored
    valid += targets[t] >= 0 ? 1 : 0;
  }
  const float inv_total_valid = 1.0f / static_cast<float>(valid + 4);  // other micro-batches too

  std::vector<float> cpu_scratch_mem(HeadScratch::Bytes(m) / sizeof(float));
  HeadScratch cpu_scratch = HeadScratch::Carve(m, cpu_scratch_mem.data());
  std::vector<float> want_dx(n * d), want_norm_grad(d, 0.0f), want_head_grad(m.vocab * d, 0.0f);
  CpuHeadArgs cpu;
  cpu.final_norm = final_norm.data();
  cpu.x_final = x_final.data();
  cpu.targets = targets.data();
  cpu.inv_total_valid = inv_total_valid;
  cpu.dx_final = want_dx.data();
  cpu.final_norm_grad = want_norm_grad.data();
  const HeadResult want = CpuHead(m, cpu, lm_head.data(), want_head_grad.data(), cpu_scratch);
  ASSERT_EQ(want.valid_tokens, valid);
  std::vector<float> want_logits(n * m.vocab);
  cpu.form = HeadForm::kLogits;
  cpu.logits = want_logits.data();
  CpuHead(m, cpu, lm_head.data(), nullptr, cpu_scratch);

  TestStream stream;
  DeviceBuffer<uint8_t> tables(CudaLayerMath::TablesBytes(m));
  LayerOffsets offsets;
  std::vector<Slot> slots;
  PackLayer(m, Biases::kNone, offsets, slots);
  auto created = CudaLayerMath::Create(m, offsets, TestRope(m), tables.get(), stream.get());
  ASSERT_TRUE(created.ok()) << created.status();
  const CudaLayerMath& math = *created;
  DeviceBuffer<uint8_t> scratch_mem(CudaHeadScratch::Bytes(m));
  CudaHeadScratch scratch = CudaHeadScratch::Carve(m, scratch_mem.get());
  DeviceBuffer<uint16_t> dev_norm(Bf16Bits(final_norm)), dev_head(Bf16Bits(lm_head)),
      dev_x(Bf16Bits(x_final)), dev_dx(n * d);
  DeviceBuffer<int32_t> dev_targets(targets);
  DeviceBuffer<float> dev_norm_grad(std::vector<float>(d, 0.0f)),
      dev_head_grad(std::vector<float>(m.vocab * d, 0.0f)), chunk_losses(HeadChunkCount(m)),
      eval_losses(HeadChunkCount(m)), dev_logits(n * m.vocab);
  const auto* norm = reinterpret_cast<const bf16*>(dev_norm.get());
  const auto* head = reinterpret_cast<const bf16*>(dev_head.get());
  const auto* x = reinterpret_cast<const bf16*>(dev_x.get());

  CudaLayerMath::HeadPointers p;
  p.final_norm = norm;
  p.x_final = x;
  p.targets = dev_targets.get();
  p.inv_total_valid = inv_total_valid;
  p.dx_final = reinterpret_cast<bf16*>(dev_dx.get());
  p.final_norm_grad = dev_norm_grad.get();
  p.chunk_loss_sums = chunk_losses.get();
  ASSERT_TRUE(math.Head(p, head, dev_head_grad.get(), scratch, stream.get()).ok());
  CudaLayerMath::HeadPointers eval;
  eval.form = HeadForm::kLoss;
  eval.final_norm = norm;
  eval.x_final = x;
  eval.targets = dev_targets.get();
  eval.chunk_loss_sums = eval_losses.get();
  ASSERT_TRUE(math.Head(eval, head, nullptr, scratch, stream.get()).ok());
  CudaLayerMath::HeadPointers logits;
  logits.form = HeadForm::kLogits;
  logits.final_norm = norm;
  logits.x_final = x;
  logits.logits = dev_logits.get();
  ASSERT_TRUE(math.Head(logits, head, nullptr, scratch, stream.get()).ok());
  ASSERT_EQ(stream.Sync(), cudaSuccess);

  const double loss = CudaLayerMath::SumChunkLosses(chunk_losses.Download());
  EXPECT_NEAR(loss, want.loss_sum, kLossTolerance * std::fabs(want.loss_sum));
  const double eval_loss = CudaLayerMath::SumChunkLosses(eval_losses.Download());
  EXPECT_NEAR(eval_loss, want.loss_sum, kLossTolerance * std::fabs(want.loss_sum));
  ExpectCloseToMax(FromBf16(dev_dx.Download()), want_dx, kGradientTolerance, "dx_final");
  ExpectCloseToMax(dev_norm_grad.Download(), want_norm_grad, kGradientTolerance, "final_norm_grad");
  ExpectCloseToMax(dev_head_grad.Download(), want_head_grad, kGradientTolerance, "lm_head_grad");
  ExpectCloseToMax(dev_logits.Download(), want_logits, kForwardTolerance, "logits");
}

TEST_F(CudaLayerMathHeadTest, EmbeddingMatchesTheCpuEmbedding) {
  const ModelDims m = TestDims();
  const int64_t n = m.tokens();
  const int64_t d = m.hidden;
  const std::vector<float> table = RandomBf16Values(m.vocab * d, 30, -1.0f, 1.0f);
  const std::vector<float> dx = RandomBf16Values(n * d, 31, -1.0f, 1.0f);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) ids[t] = static_cast<int32_t>((t * t + 5) % m.vocab);  // repeats

  std::vector<float> want_x(n * d), want_dtable(m.vocab * d, 0.0f);
  kernels::cpu::EmbeddingForward(table.data(), m.vocab, d, ids.data(), n, want_x.data());
  kernels::cpu::EmbeddingBackward(dx.data(), ids.data(), n, m.vocab, d, want_dtable.data());

  auto index = kernels::cuda::BuildEmbeddingGradIndex(ids, m.vocab);
  ASSERT_TRUE(index.ok()) << index.status();
  TestStream stream;
  DeviceBuffer<uint8_t> tables(CudaLayerMath::TablesBytes(m));
  LayerOffsets offsets;
  std::vector<Slot> slots;
  PackLayer(m, Biases::kNone, offsets, slots);
  auto created = CudaLayerMath::Create(m, offsets, TestRope(m), tables.get(), stream.get());
  ASSERT_TRUE(created.ok()) << created.status();
  DeviceBuffer<uint16_t> dev_table(Bf16Bits(table)), dev_dx(Bf16Bits(dx)), dev_x(n * d);
  DeviceBuffer<int32_t> dev_ids(ids), rows(index->unique_rows), segments(index->segment_offsets),
      order(index->token_order);
  DeviceBuffer<float> dtable(std::vector<float>(m.vocab * d, 0.0f));
  const CudaEmbeddingGradIndex dev_index{rows.get(), segments.get(), order.get(),
                                         static_cast<int64_t>(index->unique_rows.size())};

  ASSERT_TRUE(created
                  ->EmbedForward(dev_ids.get(), reinterpret_cast<const bf16*>(dev_table.get()),
                                 reinterpret_cast<bf16*>(dev_x.get()), stream.get())
                  .ok());
  ASSERT_TRUE(created
                  ->EmbedBackward(dev_index, reinterpret_cast<const bf16*>(dev_dx.get()),
                                  dtable.get(), stream.get())
                  .ok());
  ASSERT_EQ(stream.Sync(), cudaSuccess);

  EXPECT_EQ(FromBf16(dev_x.Download()), want_x);  // a gather of bf16 values is exact
  // fp32 sums of the same values in the same (token) order.
  ExpectCloseToMax(dtable.Download(), want_dtable, 1e-6, "dtable");
}

}  // namespace
}  // namespace megatrain::engine
