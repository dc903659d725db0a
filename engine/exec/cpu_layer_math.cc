// CPU implementation of the decoder layer, written over kernels/cpu.
#include "engine/exec/cpu_layer_math.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/lm_head_loss.h"
#include "kernels/cpu/residual.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/swiglu.h"

namespace megatrain::engine {
namespace {

namespace k = kernels::cpu;

const float* At(const float* base, int64_t offset) { return offset < 0 ? nullptr : base + offset; }
float* At(float* base, int64_t offset) { return offset < 0 ? nullptr : base + offset; }

k::AttentionShape ShapeOf(const ModelDims& m) {
  k::AttentionShape s;
  s.batch = m.batch;
  s.seq = m.seq;
  s.q_heads = m.q_heads;
  s.kv_heads = m.kv_heads;
  s.head_dim = m.head_dim;
  s.scale = 1.0f / std::sqrt(static_cast<float>(m.head_dim));
  s.window = m.sliding_window;
  return s;
}

// Tile sizes are part of the numerics (see kernels/cpu/attention.h): fixed here.
constexpr k::AttentionTiles kTiles{64, 64};

// One sequence of the micro-batch: attention never mixes sequences.
k::AttentionShape SequenceShape(const ModelDims& m) {
  k::AttentionShape s = ShapeOf(m);
  s.batch = 1;
  return s;
}

size_t SequenceWorkspaceFloats(const ModelDims& m) {
  return std::max(k::AttentionForwardWorkspaceFloats(SequenceShape(m), kTiles),
                  k::AttentionBackwardWorkspaceFloats(SequenceShape(m), kTiles));
}

// Calls fn(b) for every sequence b of the micro-batch, on the pool if any.
void ForEachSequence(const LayerContext& ctx, const std::function<void(size_t)>& fn) {
  const size_t batch = static_cast<size_t>(ctx.dims->batch);
  if (ctx.pool != nullptr && batch > 1) {
    ctx.pool->ParallelFor(batch, fn);
  } else {
    for (size_t b = 0; b < batch; ++b) fn(b);
  }
}

void AttentionForwardAllSequences(const LayerContext& ctx, LayerActivations& a) {
  const ModelDims& m = *ctx.dims;
  const size_t q_stride = static_cast<size_t>(m.seq * m.q_width());
  const size_t kv_stride = static_cast<size_t>(m.seq * m.kv_width());
  const size_t lse_stride = static_cast<size_t>(m.q_heads * m.seq);
  const size_t ws_stride = SequenceWorkspaceFloats(m);
  ForEachSequence(ctx, [&](size_t b) {
    k::AttentionForward(SequenceShape(m), kTiles, a.q + b * q_stride, a.k + b * kv_stride,
                        a.v + b * kv_stride, a.attn + b * q_stride, a.lse + b * lse_stride,
                        ctx.attention_workspace + b * ws_stride);
  });
}

void AttentionBackwardAllSequences(const LayerContext& ctx, const LayerActivations& a,
                                   LayerBackwardScratch& s) {
  const ModelDims& m = *ctx.dims;
  const size_t q_stride = static_cast<size_t>(m.seq * m.q_width());
  const size_t kv_stride = static_cast<size_t>(m.seq * m.kv_width());
  const size_t lse_stride = static_cast<size_t>(m.q_heads * m.seq);
  const size_t ws_stride = SequenceWorkspaceFloats(m);
  ForEachSequence(ctx, [&](size_t b) {
    k::AttentionBackward(SequenceShape(m), kTiles, a.q + b * q_stride, a.k + b * kv_stride,
                         a.v + b * kv_stride, a.attn + b * q_stride, a.lse + b * lse_stride,
                         s.d_attn + b * q_stride, s.d_q + b * q_stride, s.d_k + b * kv_stride,
                         s.d_v + b * kv_stride, ctx.attention_workspace + b * ws_stride);
  });
}

}  // namespace

size_t AttentionWorkspaceFloats(const ModelDims& dims) {
  return SequenceWorkspaceFloats(dims) * static_cast<size_t>(dims.batch);
}

void CpuLayerForward(const LayerContext& ctx, const float* w, const float* x_in,
                     LayerActivations& a, float* x_out) {
  const ModelDims& m = *ctx.dims;
  const LayerOffsets& o = *ctx.offsets;
  const int64_t n = m.tokens();
  const int64_t d = m.hidden;
  std::memcpy(a.x_in, x_in, sizeof(float) * n * d);

  k::RmsnormForward(a.x_in, w + o.input_norm, n, d, m.rms_eps, a.h1, a.rstd1);
  k::LinearForward(a.h1, w + o.q, At(w, o.q_bias), n, d, m.q_width(), a.q);
  k::LinearForward(a.h1, w + o.k, At(w, o.k_bias), n, d, m.kv_width(), a.k);
  k::LinearForward(a.h1, w + o.v, At(w, o.v_bias), n, d, m.kv_width(), a.v);
  k::RopeForward(*ctx.rope, ctx.positions, n, m.q_heads, a.q);
  k::RopeForward(*ctx.rope, ctx.positions, n, m.kv_heads, a.k);
  AttentionForwardAllSequences(ctx, a);

  // x_mid = x_in + attn W_o^T (+ b_o)
  k::LinearForward(a.attn, w + o.o, At(w, o.o_bias), n, m.q_width(), d, a.x_mid);
  k::ResidualAdd(a.x_in, n * d, a.x_mid);

  k::RmsnormForward(a.x_mid, w + o.post_norm, n, d, m.rms_eps, a.h2, a.rstd2);
  k::LinearForward(a.h2, w + o.gate, At(w, o.gate_bias), n, d, m.ffn, a.gate);
  k::LinearForward(a.h2, w + o.up, At(w, o.up_bias), n, d, m.ffn, a.up);
  k::SwigluForward(a.gate, a.up, n * m.ffn, a.act);

  // x_out = x_mid + act W_down^T (+ b_down)
  k::LinearForward(a.act, w + o.down, At(w, o.down_bias), n, m.ffn, d, x_out);
  k::ResidualAdd(a.x_mid, n * d, x_out);
}

void CpuLayerBackward(const LayerContext& ctx, const float* w, const LayerActivations& a,
                      LayerBackwardScratch& s, const float* dx_out, float* dx_in, float* g) {
  const ModelDims& m = *ctx.dims;
  const LayerOffsets& o = *ctx.offsets;
  const int64_t n = m.tokens();
  const int64_t d = m.hidden;
  using k::GradMode;

  // MLP: x_out = x_mid + down(swiglu(gate(h2), up(h2))).
  k::LinearBackward(dx_out, a.act, w + o.down, n, m.ffn, d, s.d_act, GradMode::kOverwrite,
                    g + o.down, At(g, o.down_bias));
  k::SwigluBackward(a.gate, a.up, s.d_act, n * m.ffn, s.d_gate, s.d_up);
  k::LinearBackward(s.d_gate, a.h2, w + o.gate, n, d, m.ffn, s.d_h, GradMode::kOverwrite,
                    g + o.gate, At(g, o.gate_bias));
  k::LinearBackward(s.d_up, a.h2, w + o.up, n, d, m.ffn, s.d_h, GradMode::kAccumulate, g + o.up,
                    At(g, o.up_bias));
  // d x_mid = dx_out (residual) + norm backward of d h2.
  float* d_mid = dx_in;  // dx_in doubles as d x_mid until the attention half adds to it
  std::memcpy(d_mid, dx_out, sizeof(float) * n * d);
  k::RmsnormBackward(s.d_h, a.x_mid, w + o.post_norm, a.rstd2, n, d, d_mid, g + o.post_norm);

  // Attention: x_mid = x_in + o(attn(rope(q(h1)), rope(k(h1)), v(h1))).
  k::LinearBackward(d_mid, a.attn, w + o.o, n, m.q_width(), d, s.d_attn, GradMode::kOverwrite,
                    g + o.o, At(g, o.o_bias));
  AttentionBackwardAllSequences(ctx, a, s);
  k::RopeBackward(*ctx.rope, ctx.positions, n, m.q_heads, s.d_q);
  k::RopeBackward(*ctx.rope, ctx.positions, n, m.kv_heads, s.d_k);
  k::LinearBackward(s.d_q, a.h1, w + o.q, n, d, m.q_width(), s.d_h, GradMode::kOverwrite, g + o.q,
                    At(g, o.q_bias));
  k::LinearBackward(s.d_k, a.h1, w + o.k, n, d, m.kv_width(), s.d_h, GradMode::kAccumulate, g + o.k,
                    At(g, o.k_bias));
  k::LinearBackward(s.d_v, a.h1, w + o.v, n, d, m.kv_width(), s.d_h, GradMode::kAccumulate, g + o.v,
                    At(g, o.v_bias));
  // dx_in = d x_mid (residual, already in place) + norm backward of d h1.
  k::RmsnormBackward(s.d_h, a.x_in, w + o.input_norm, a.rstd1, n, d, dx_in, g + o.input_norm);
}

HeadResult CpuHeadForwardBackward(const ModelDims& m, const float* final_norm, const float* lm_head,
                                  const float* x_final, const int32_t* targets,
                                  float inv_total_valid, HeadScratch& s, float* dx_final,
                                  float* final_norm_grad, float* lm_head_grad) {
  const int64_t n = m.tokens();
  const int64_t d = m.hidden;
  k::RmsnormForward(x_final, final_norm, n, d, m.rms_eps, s.h, s.rstd);
  const k::LmHeadLossResult r =
      k::LmHeadCrossEntropy(s.h, lm_head, targets, n, d, m.vocab, m.head_chunk, inv_total_valid,
                            s.logits, s.d_h, lm_head_grad);
  std::memset(dx_final, 0, sizeof(float) * n * d);
  k::RmsnormBackward(s.d_h, x_final, final_norm, s.rstd, n, d, dx_final, final_norm_grad);
  return HeadResult{r.loss_sum, r.valid_count};
}

HeadResult CpuHeadLoss(const ModelDims& m, const float* final_norm, const float* lm_head,
                       const float* x_final, const int32_t* targets, HeadScratch& s) {
  k::RmsnormForward(x_final, final_norm, m.tokens(), m.hidden, m.rms_eps, s.h, s.rstd);
  const k::LmHeadLossResult r =
      k::LmHeadCrossEntropy(s.h, lm_head, targets, m.tokens(), m.hidden, m.vocab, m.head_chunk,
                            0.0f, s.logits, nullptr, nullptr);
  return HeadResult{r.loss_sum, r.valid_count};
}

void CpuHeadLogits(const ModelDims& m, const float* final_norm, const float* lm_head,
                   const float* x_final, HeadScratch& s, float* logits) {
  k::RmsnormForward(x_final, final_norm, m.tokens(), m.hidden, m.rms_eps, s.h, s.rstd);
  k::LmHeadLogits(s.h, lm_head, m.tokens(), m.hidden, m.vocab, logits);
}

}  // namespace megatrain::engine
