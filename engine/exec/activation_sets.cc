// Carving of the executor's device buffers; every piece starts 64-byte aligned.
#include "engine/exec/activation_sets.h"

namespace megatrain::engine {
namespace {

constexpr size_t kAlignFloats = 16;

size_t Aligned(int64_t n) {
  const size_t u = static_cast<size_t>(n);
  return (u + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
}

// Hands out consecutive aligned pieces of a float range; with base == nullptr
// it only counts.
class Carver {
 public:
  explicit Carver(float* base) : base_(base) {}
  float* Take(int64_t n) {
    float* p = base_ ? base_ + used_ : nullptr;
    used_ += Aligned(n);
    return p;
  }
  size_t used() const { return used_; }

 private:
  float* base_;
  size_t used_ = 0;
};

LayerActivations CarveInto(const ModelDims& m, Carver& c, LayerActivations*) {
  LayerActivations a;
  const int64_t n = m.tokens();
  a.x_in = c.Take(n * m.hidden);
  a.h1 = c.Take(n * m.hidden);
  a.rstd1 = c.Take(n);
  a.q = c.Take(n * m.q_width());
  a.k = c.Take(n * m.kv_width());
  a.v = c.Take(n * m.kv_width());
  a.attn = c.Take(n * m.q_width());
  a.lse = c.Take(m.batch * m.q_heads * m.seq);
  a.x_mid = c.Take(n * m.hidden);
  a.h2 = c.Take(n * m.hidden);
  a.rstd2 = c.Take(n);
  a.gate = c.Take(n * m.ffn);
  a.up = c.Take(n * m.ffn);
  a.act = c.Take(n * m.ffn);
  return a;
}

LayerBackwardScratch CarveInto(const ModelDims& m, Carver& c, LayerBackwardScratch*) {
  LayerBackwardScratch s;
  const int64_t n = m.tokens();
  s.d_act = c.Take(n * m.ffn);
  s.d_gate = c.Take(n * m.ffn);
  s.d_up = c.Take(n * m.ffn);
  s.d_h = c.Take(n * m.hidden);
  s.d_attn = c.Take(n * m.q_width());
  s.d_q = c.Take(n * m.q_width());
  s.d_k = c.Take(n * m.kv_width());
  s.d_v = c.Take(n * m.kv_width());
  return s;
}

HeadScratch CarveInto(const ModelDims& m, Carver& c, HeadScratch*) {
  HeadScratch h;
  const int64_t n = m.tokens();
  h.h = c.Take(n * m.hidden);
  h.rstd = c.Take(n);
  h.d_h = c.Take(n * m.hidden);
  h.row_max = c.Take(n);
  h.row_sum = c.Take(n);
  h.target_logit = c.Take(n);
  h.logits = c.Take(m.head_chunk * HeadBlockRows(m));
  return h;
}

}  // namespace

#define MEGATRAIN_CARVED_STRUCT(T)                    \
  T T::Carve(const ModelDims& m, float* base) {       \
    Carver c(base);                                   \
    return CarveInto(m, c, static_cast<T*>(nullptr)); \
  }                                                   \
  size_t T::FloatCount(const ModelDims& m) {          \
    Carver c(nullptr);                                \
    CarveInto(m, c, static_cast<T*>(nullptr));        \
    return c.used();                                  \
  }

MEGATRAIN_CARVED_STRUCT(LayerActivations)
MEGATRAIN_CARVED_STRUCT(LayerBackwardScratch)
MEGATRAIN_CARVED_STRUCT(HeadScratch)

#undef MEGATRAIN_CARVED_STRUCT

}  // namespace megatrain::engine
