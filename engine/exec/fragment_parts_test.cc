// The layer math's parts read each tensor through its own pointer: the parts
// run back to back over tensors scattered in separate buffers give exactly the
// bits of the whole layer over the packed entry (forward and backward, with
// biases, odd sizes).
#include "engine/exec/fragment_parts.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "engine/exec/cpu_layer_math.h"

namespace megatrain::engine {
namespace {

ModelDims Dims() {
  ModelDims m;
  m.vocab = 29;
  m.hidden = 24;
  m.ffn = 37;
  m.q_heads = 3;
  m.kv_heads = 1;
  m.head_dim = 8;
  m.num_layers = 1;
  m.batch = 2;
  m.seq = 5;
  m.head_chunk = 3;
  m.qk_norm = true;  // every tensor is packed, qwen3's q/k norms too
  return m;
}

// Every tensor, biases and q/k norms included, packed in TensorRole order.
LayerOffsets PackAll(const ModelDims& m, int64_t* total) {
  LayerOffsets o;
  int64_t at = 0;
  for (int i = 0; i < kLayerTensorCount; ++i) {
    const TensorRole t = LayerTensorAt(i);
    int64_t* field = nullptr;
    switch (t) {
      case TensorRole::kInputNorm:
        field = &o.input_norm;
        break;
      case TensorRole::kQ:
        field = &o.q;
        break;
      case TensorRole::kQBias:
        field = &o.q_bias;
        break;
      case TensorRole::kQNorm:
        field = &o.q_norm;
        break;
      case TensorRole::kK:
        field = &o.k;
        break;
      case TensorRole::kKBias:
        field = &o.k_bias;
        break;
      case TensorRole::kKNorm:
        field = &o.k_norm;
        break;
      case TensorRole::kV:
        field = &o.v;
        break;
      case TensorRole::kVBias:
        field = &o.v_bias;
        break;
      case TensorRole::kO:
        field = &o.o;
        break;
      case TensorRole::kOBias:
        field = &o.o_bias;
        break;
      case TensorRole::kPostAttentionNorm:
        field = &o.post_norm;
        break;
      case TensorRole::kGate:
        field = &o.gate;
        break;
      case TensorRole::kGateBias:
        field = &o.gate_bias;
        break;
      case TensorRole::kUp:
        field = &o.up;
        break;
      case TensorRole::kUpBias:
        field = &o.up_bias;
        break;
      case TensorRole::kDown:
        field = &o.down;
        break;
      case TensorRole::kDownBias:
        field = &o.down_bias;
        break;
      default:  // the roles outside a layer
        break;
    }
    *field = at;
    at += ExtentOf(m, t).elements;
  }
  *total = at;
  return o;
}

std::vector<float> Values(size_t n, uint32_t seed, float scale) {
  std::vector<float> v(n);
  uint32_t s = seed;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = scale * (static_cast<float>(s >> 8) / 16777216.0f - 0.5f);
  }
  return v;
}

TEST(FragmentPartsTest, PartsOverScatteredTensorsMatchTheWholeLayerBitwise) {
  const ModelDims m = Dims();
  int64_t total = 0;
  const LayerOffsets offsets = PackAll(m, &total);
  std::vector<float> packed = Values(static_cast<size_t>(total), 11, 0.5f);
  for (TensorRole norm : {TensorRole::kInputNorm, TensorRole::kPostAttentionNorm,
                          TensorRole::kQNorm, TensorRole::kKNorm}) {
    const int64_t width = ExtentOf(m, norm).elements;
    for (int64_t i = 0; i < width; ++i) packed[OffsetOf(offsets, norm) + i] += 1.0f;
  }
  // Each tensor copied into its own buffer.
  std::vector<std::vector<float>> scattered(kLayerTensorCount);
  LayerWeights w;
  for (int i = 0; i < kLayerTensorCount; ++i) {
    const TensorRole t = LayerTensorAt(i);
    const float* src = packed.data() + OffsetOf(offsets, t);
    scattered[i].assign(src, src + ExtentOf(m, t).elements);
    w[t] = scattered[i].data();
  }
  absl::StatusOr<kernels::cpu::RopeTable> rope =
      kernels::cpu::RopeTable::Create(m.seq, m.head_dim, 10000.0, kernels::RopeScaling{});
  ASSERT_TRUE(rope.ok());
  const int64_t n = m.tokens();
  std::vector<int32_t> positions(n);
  for (int64_t t = 0; t < n; ++t) positions[t] = static_cast<int32_t>(t % m.seq);
  std::vector<float> workspace(AttentionWorkspaceFloats(m));
  const LayerContext ctx{&m, &offsets, &*rope, positions.data(), workspace.data(), nullptr};
  const std::vector<float> x_in = Values(n * m.hidden, 3, 2.0f);
  const std::vector<float> dx_out = Values(n * m.hidden, 4, 1.0f);

  struct Result {
    std::vector<float> act_mem, scratch_mem, x_out, dx_in, grads;
  };
  auto run = [&](bool parts) {
    Result r;
    r.act_mem.assign(LayerActivations::Bytes(m) / sizeof(float), 0.0f);
    r.scratch_mem.assign(LayerBackwardScratch::Bytes(m) / sizeof(float), 0.0f);
    r.x_out.assign(n * m.hidden, 0.0f);
    r.dx_in.assign(n * m.hidden, 0.0f);
    r.grads.assign(static_cast<size_t>(total), 0.25f);  // gradients are added
    LayerActivations act = LayerActivations::Carve(m, r.act_mem.data());
    LayerBackwardScratch scratch = LayerBackwardScratch::Carve(m, r.scratch_mem.data());
    if (parts) {
      for (int p = 0; p < kLayerParts; ++p) {
        CpuLayerForwardPart(ctx, p, w, x_in.data(), act, r.x_out.data());
      }
      for (int p = 0; p < kLayerParts; ++p) {
        CpuLayerBackwardPart(ctx, p, w, act, scratch, dx_out.data(), r.dx_in.data(),
                             r.grads.data());
      }
    } else {
      CpuLayerForward(ctx, packed.data(), x_in.data(), act, r.x_out.data());
      CpuLayerBackward(ctx, packed.data(), act, scratch, dx_out.data(), r.dx_in.data(),
                       r.grads.data());
    }
    return r;
  };
  const Result whole = run(false);
  const Result split = run(true);
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  EXPECT_TRUE(same(whole.x_out, split.x_out));
  EXPECT_TRUE(same(whole.act_mem, split.act_mem));
  EXPECT_TRUE(same(whole.dx_in, split.dx_in));
  EXPECT_TRUE(same(whole.grads, split.grads));
  bool nonzero = false;
  for (float v : whole.dx_in) nonzero |= v != 0.0f;
  EXPECT_TRUE(nonzero);
}

TEST(FragmentPartsTest, EveryTensorIsReadByExactlyOnePartEachWay) {
  std::vector<int> forward(kLayerTensorCount, 0), backward(kLayerTensorCount, 0);
  for (int p = 0; p < kLayerParts; ++p) {
    for (std::vector<int>* seen : {&forward, &backward}) {
      const TensorRole t = seen == &forward ? ForwardPartTensor(p) : BackwardPartTensor(p);
      ++(*seen)[static_cast<int>(t)];
      if (BiasOf(t) != t) ++(*seen)[static_cast<int>(BiasOf(t))];
      if (HeadNormOf(t) != t) ++(*seen)[static_cast<int>(HeadNormOf(t))];
    }
  }
  for (int i = 0; i < kLayerTensorCount; ++i) {
    EXPECT_EQ(forward[i], 1) << LayerTensorName(LayerTensorAt(i));
    EXPECT_EQ(backward[i], 1) << LayerTensorName(LayerTensorAt(i));
  }
}

}  // namespace
}  // namespace megatrain::engine
