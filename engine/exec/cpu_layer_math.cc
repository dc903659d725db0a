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

// out[N, heads*D] = x W^T (+ b), then qwen3's RMSNorm of every head when
// `head_norm` is set: the projection goes to `proj` (kept for the backward)
// and each [D] row of it is normalised into `out`, its rstd into `rstd`:
// q becomes rope(q_norm(q(h1))), k likewise.
void ProjectHeads(const ModelDims& m, const float* x, const float* w, const float* bias,
                  const float* head_norm, int64_t heads, float* proj, float* rstd, float* out) {
  const int64_t n = m.tokens();
  const int64_t width = heads * m.head_dim;
  if (head_norm == nullptr) {
    k::LinearForward(x, w, bias, n, m.hidden, width, out);
    return;
  }
  k::LinearForward(x, w, bias, n, m.hidden, width, proj);
  k::RmsnormForward(proj, head_norm, n * heads, m.head_dim, m.rms_eps, out, rstd);
}

// The backward of ProjectHeads given d_out: with a head norm, its backward
// first (into `d_proj`, zeroed here; head_norm_grad accumulates), then the
// projection's. dx is overwritten or accumulated as `mode` says.
void ProjectHeadsBackward(const ModelDims& m, const float* d_out, const float* x, const float* w,
                          const float* head_norm, const float* proj, const float* rstd,
                          int64_t heads, float* d_proj, float* dx, k::GradMode mode, float* dw,
                          float* db, float* head_norm_grad) {
  const int64_t n = m.tokens();
  const int64_t width = heads * m.head_dim;
  const float* dy = d_out;
  if (head_norm != nullptr) {
    std::memset(d_proj, 0, sizeof(float) * n * width);
    k::RmsnormBackward(d_out, proj, head_norm, rstd, n * heads, m.head_dim, d_proj,
                       head_norm_grad);
    dy = d_proj;
  }
  k::LinearBackward(dy, x, w, n, m.hidden, width, dx, mode, dw, db);
}

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

// The segment ids of sequence b, or null when the micro-batch has none.
const int32_t* SequenceSegments(const LayerContext& ctx, size_t b) {
  return ctx.segments == nullptr ? nullptr : ctx.segments + b * static_cast<size_t>(ctx.dims->seq);
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
                        ctx.attention_workspace + b * ws_stride, SequenceSegments(ctx, b));
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
                         s.d_v + b * kv_stride, ctx.attention_workspace + b * ws_stride,
                         SequenceSegments(ctx, b));
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
      ProjectHeads(m, a.h1, w.q, w.q_bias, w.q_norm, m.q_heads, a.q_proj, a.rstd_q, a.q);
      return;
    case 2:
      ProjectHeads(m, a.h1, w.k, w.k_bias, w.k_norm, m.kv_heads, a.k_proj, a.rstd_k, a.k);
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
    // d_attn is free once attention's backward ran: it holds qwen3's
    // gradient at the q, then the k projection.
    case 5:
      ProjectHeadsBackward(m, s.d_q, a.h1, w.q, w.q_norm, a.q_proj, a.rstd_q, m.q_heads, s.d_attn,
                           s.d_h, GradMode::kOverwrite, g + o.q, At(g, o.q_bias),
                           At(g, o.q_norm));
      return;
    case 6:
      ProjectHeadsBackward(m, s.d_k, a.h1, w.k, w.k_norm, a.k_proj, a.rstd_k, m.kv_heads, s.d_attn,
                           s.d_h, GradMode::kAccumulate, g + o.k, At(g, o.k_bias),
                           At(g, o.k_norm));
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

namespace {

k::LmHeadRowStats StatsOf(HeadScratch& s) { return {s.row_max, s.row_sum, s.target_logit}; }

k::LmHeadBlock BlockOf(const ModelDims& m, int b, const CpuHeadArgs& a, HeadScratch& s) {
  const HeadBlock block = HeadBlockAt(m, b);
  return k::LmHeadBlock{s.h,    a.lm_block,  a.targets,   m.tokens(), m.hidden,
                        block.first_row, block.rows, m.head_chunk, s.logits};
}

}  // namespace

std::optional<HeadResult> CpuHeadStep(const ModelDims& m, HeadStep step, const CpuHeadArgs& a,
                                      HeadScratch& s) {
  const int64_t n = m.tokens();
  const int64_t d = m.hidden;
  switch (step.kind) {
    case HeadStepKind::kNorm:
      k::RmsnormForward(a.x_final, a.final_norm, n, d, m.rms_eps, s.h, s.rstd);
      k::LmHeadResetStats(StatsOf(s), n);
      return std::nullopt;
    case HeadStepKind::kForwardBlock: {
      const k::LmHeadBlock block = BlockOf(m, step.block, a, s);
      if (a.form == HeadForm::kLogits) {
        k::LmHeadBlockLogits(block, m.vocab, a.logits);
        return std::nullopt;
      }
      k::LmHeadBlockForward(block, StatsOf(s));
      if (step.block + 1 < HeadBlockCount(m)) return std::nullopt;
      const k::LmHeadLossResult r = k::LmHeadLossFromStats(StatsOf(s), a.targets, n);
      return HeadResult{r.loss_sum, r.valid_count};
    }
    case HeadStepKind::kBackwardBlock:
      k::LmHeadBlockBackward(BlockOf(m, step.block, a, s), StatsOf(s), a.inv_total_valid,
                             step.block == 0, s.d_h, a.lm_block_grad);
      return std::nullopt;
    case HeadStepKind::kNormBackward:
      std::memset(a.dx_final, 0, sizeof(float) * n * d);
      std::memset(a.final_norm_grad, 0, sizeof(float) * d);
      k::RmsnormBackward(s.d_h, a.x_final, a.final_norm, s.rstd, n, d, a.dx_final,
                         a.final_norm_grad);
      return std::nullopt;
  }
  return std::nullopt;
}

HeadResult CpuHead(const ModelDims& m, CpuHeadArgs a, const float* lm_head, float* lm_head_grad,
                   HeadScratch& s) {
  HeadResult result;
  const int parts = HeadPartCount(m, a.form == HeadForm::kTrain);
  for (int p = 0; p < parts; ++p) {
    const HeadStep step = HeadStepAt(m, p);
    const int64_t first = HeadBlockAt(m, step.block).first_row * m.hidden;
    a.lm_block = lm_head + first;
    a.lm_block_grad = lm_head_grad == nullptr ? nullptr : lm_head_grad + first;
    if (std::optional<HeadResult> r = CpuHeadStep(m, step, a, s)) result = *r;
  }
  return result;
}

}  // namespace megatrain::engine
