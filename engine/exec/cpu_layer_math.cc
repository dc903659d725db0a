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

void CpuLayerForwardPart(const LayerContext& ctx, int part, const LayerWeights& w,
                         const float* x_in, LayerActivations& a, float* x_out) {
  const ModelDims& m = *ctx.dims;
  const int64_t n = m.tokens();
  const int64_t d = m.hidden;
  switch (part) {
    case 0:  // input_norm
      std::memcpy(a.x_in, x_in, sizeof(float) * n * d);
      k::RmsnormForward(a.x_in, w.input_norm, n, d, m.rms_eps, a.h1, a.rstd1);
      return;
    case 1:
      k::LinearForward(a.h1, w.q, w.q_bias, n, d, m.q_width(), a.q);
      return;
    case 2:
      k::LinearForward(a.h1, w.k, w.k_bias, n, d, m.kv_width(), a.k);
      return;
    case 3:
      k::LinearForward(a.h1, w.v, w.v_bias, n, d, m.kv_width(), a.v);
      k::RopeForward(*ctx.rope, ctx.positions, n, m.q_heads, a.q);
      k::RopeForward(*ctx.rope, ctx.positions, n, m.kv_heads, a.k);
      AttentionForwardAllSequences(ctx, a);
      return;
    case 4:  // x_mid = x_in + attn W_o^T (+ b_o)
      k::LinearForward(a.attn, w.o, w.o_bias, n, m.q_width(), d, a.x_mid);
      k::ResidualAdd(a.x_in, n * d, a.x_mid);
      return;
    case 5:
      k::RmsnormForward(a.x_mid, w.post_norm, n, d, m.rms_eps, a.h2, a.rstd2);
      return;
    case 6:
      k::LinearForward(a.h2, w.gate, w.gate_bias, n, d, m.ffn, a.gate);
      return;
    case 7:
      k::LinearForward(a.h2, w.up, w.up_bias, n, d, m.ffn, a.up);
      k::SwigluForward(a.gate, a.up, n * m.ffn, a.act);
      return;
    case 8:  // x_out = x_mid + act W_down^T (+ b_down)
      k::LinearForward(a.act, w.down, w.down_bias, n, m.ffn, d, x_out);
      k::ResidualAdd(a.x_mid, n * d, x_out);
      return;
  }
}

void CpuLayerForward(const LayerContext& ctx, const LayerWeights& w, const float* x_in,
                     LayerActivations& a, float* x_out) {
  for (int part = 0; part < kLayerParts; ++part) CpuLayerForwardPart(ctx, part, w, x_in, a, x_out);
}

void CpuLayerForward(const LayerContext& ctx, const float* w, const float* x_in,
                     LayerActivations& a, float* x_out) {
  CpuLayerForward(ctx, LayerWeightsAt(w, *ctx.offsets), x_in, a, x_out);
}

void CpuLayerBackwardPart(const LayerContext& ctx, int part, const LayerWeights& w,
                          const LayerActivations& a, LayerBackwardScratch& s, const float* dx_out,
                          float* dx_in, float* g) {
  const ModelDims& m = *ctx.dims;
  const LayerOffsets& o = *ctx.offsets;
  const int64_t n = m.tokens();
  const int64_t d = m.hidden;
  using k::GradMode;
  // dx_in doubles as d x_mid until the attention half adds to it.
  float* d_mid = dx_in;
  switch (part) {
    // MLP: x_out = x_mid + down(swiglu(gate(h2), up(h2))).
    case 0:
      k::LinearBackward(dx_out, a.act, w.down, n, m.ffn, d, s.d_act, GradMode::kOverwrite,
                        g + o.down, At(g, o.down_bias));
      k::SwigluBackward(a.gate, a.up, s.d_act, n * m.ffn, s.d_gate, s.d_up);
      return;
    case 1:
      k::LinearBackward(s.d_gate, a.h2, w.gate, n, d, m.ffn, s.d_h, GradMode::kOverwrite,
                        g + o.gate, At(g, o.gate_bias));
      return;
    case 2:
      k::LinearBackward(s.d_up, a.h2, w.up, n, d, m.ffn, s.d_h, GradMode::kAccumulate, g + o.up,
                        At(g, o.up_bias));
      return;
    case 3:  // d x_mid = dx_out (residual) + norm backward of d h2.
      std::memcpy(d_mid, dx_out, sizeof(float) * n * d);
      k::RmsnormBackward(s.d_h, a.x_mid, w.post_norm, a.rstd2, n, d, d_mid, g + o.post_norm);
      return;
    // Attention: x_mid = x_in + o(attn(rope(q(h1)), rope(k(h1)), v(h1))).
    case 4:
      k::LinearBackward(d_mid, a.attn, w.o, n, m.q_width(), d, s.d_attn, GradMode::kOverwrite,
                        g + o.o, At(g, o.o_bias));
      AttentionBackwardAllSequences(ctx, a, s);
      k::RopeBackward(*ctx.rope, ctx.positions, n, m.q_heads, s.d_q);
      k::RopeBackward(*ctx.rope, ctx.positions, n, m.kv_heads, s.d_k);
      return;
    case 5:
      k::LinearBackward(s.d_q, a.h1, w.q, n, d, m.q_width(), s.d_h, GradMode::kOverwrite, g + o.q,
                        At(g, o.q_bias));
      return;
    case 6:
      k::LinearBackward(s.d_k, a.h1, w.k, n, d, m.kv_width(), s.d_h, GradMode::kAccumulate, g + o.k,
                        At(g, o.k_bias));
      return;
    case 7:
      k::LinearBackward(s.d_v, a.h1, w.v, n, d, m.kv_width(), s.d_h, GradMode::kAccumulate, g + o.v,
                        At(g, o.v_bias));
      return;
    case 8:  // dx_in = d x_mid (residual, already in place) + norm backward of d h1.
      k::RmsnormBackward(s.d_h, a.x_in, w.input_norm, a.rstd1, n, d, dx_in, g + o.input_norm);
      return;
  }
}

void CpuLayerBackward(const LayerContext& ctx, const LayerWeights& w, const LayerActivations& a,
                      LayerBackwardScratch& s, const float* dx_out, float* dx_in, float* g) {
  for (int part = 0; part < kLayerParts; ++part) {
    CpuLayerBackwardPart(ctx, part, w, a, s, dx_out, dx_in, g);
  }
}

void CpuLayerBackward(const LayerContext& ctx, const float* w, const LayerActivations& a,
                      LayerBackwardScratch& s, const float* dx_out, float* dx_in, float* g) {
  CpuLayerBackward(ctx, LayerWeightsAt(w, *ctx.offsets), a, s, dx_out, dx_in, g);
}

void CpuHeadNorm(const ModelDims& m, const float* final_norm, const float* x_final,
                 HeadScratch& s) {
  k::RmsnormForward(x_final, final_norm, m.tokens(), m.hidden, m.rms_eps, s.h, s.rstd);
}

HeadResult CpuHeadForwardBackwardAfterNorm(const ModelDims& m, const float* final_norm,
                                           const float* lm_head, const float* x_final,
                                           const int32_t* targets, float inv_total_valid,
                                           HeadScratch& s, float* dx_final, float* final_norm_grad,
                                           float* lm_head_grad) {
  const int64_t n = m.tokens();
  const int64_t d = m.hidden;
  const k::LmHeadLossResult r =
      k::LmHeadCrossEntropy(s.h, lm_head, targets, n, d, m.vocab, m.head_chunk, inv_total_valid,
                            s.logits, s.d_h, lm_head_grad);
  std::memset(dx_final, 0, sizeof(float) * n * d);
  k::RmsnormBackward(s.d_h, x_final, final_norm, s.rstd, n, d, dx_final, final_norm_grad);
  return HeadResult{r.loss_sum, r.valid_count};
}

HeadResult CpuHeadLossAfterNorm(const ModelDims& m, const float* lm_head, const int32_t* targets,
                                HeadScratch& s) {
  const k::LmHeadLossResult r =
      k::LmHeadCrossEntropy(s.h, lm_head, targets, m.tokens(), m.hidden, m.vocab, m.head_chunk,
                            0.0f, s.logits, nullptr, nullptr);
  return HeadResult{r.loss_sum, r.valid_count};
}

void CpuHeadLogitsAfterNorm(const ModelDims& m, const float* lm_head, HeadScratch& s,
                            float* logits) {
  k::LmHeadLogits(s.h, lm_head, m.tokens(), m.hidden, m.vocab, logits);
}

HeadResult CpuHeadForwardBackward(const ModelDims& m, const float* final_norm, const float* lm_head,
                                  const float* x_final, const int32_t* targets,
                                  float inv_total_valid, HeadScratch& s, float* dx_final,
                                  float* final_norm_grad, float* lm_head_grad) {
  CpuHeadNorm(m, final_norm, x_final, s);
  return CpuHeadForwardBackwardAfterNorm(m, final_norm, lm_head, x_final, targets, inv_total_valid,
                                         s, dx_final, final_norm_grad, lm_head_grad);
}

HeadResult CpuHeadLoss(const ModelDims& m, const float* final_norm, const float* lm_head,
                       const float* x_final, const int32_t* targets, HeadScratch& s) {
  CpuHeadNorm(m, final_norm, x_final, s);
  return CpuHeadLossAfterNorm(m, lm_head, targets, s);
}

void CpuHeadLogits(const ModelDims& m, const float* final_norm, const float* lm_head,
                   const float* x_final, HeadScratch& s, float* logits) {
  CpuHeadNorm(m, final_norm, x_final, s);
  CpuHeadLogitsAfterNorm(m, lm_head, s, logits);
}

}  // namespace megatrain::engine
