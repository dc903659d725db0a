// Fragmented weight streaming's vocabulary: a decoder layer's tensors, the
// per-tensor weight pointers the layer math reads, and the parts a layer's
// forward, backward and the head run as (each part reads one tensor with its
// bias; the head's parts read the final norm, then the LM head's vocabulary
// blocks once for the loss and once more for the gradients).
#pragma once

#include <cstdint>

#include "engine/exec/model_dims.h"
#include "engine/model/tensor_role.h"

namespace megatrain::engine {


// Parts of a layer's forward and backward.
inline constexpr int kLayerParts = 9;

// The head's parts, in order: the final norm; each vocabulary block's logits
// (folded into the running log-sum-exp, or written out as logits); for a
// training head then each block again for its gradients (the loss needs every
// block first), and the final norm's backward. Part p of a head reads unit p
// of the fragment plan: one tensor, the final norm or one block's rows.
// What the head computes: the loss and its gradients (training), the loss
// (evaluation), or every token's logits (tests and sampling).
enum class HeadForm { kTrain, kLoss, kLogits };

enum class HeadStepKind { kNorm, kForwardBlock, kBackwardBlock, kNormBackward };
struct HeadStep {
  HeadStepKind kind = HeadStepKind::kNorm;
  int block = 0;  // for the block steps
};
inline int HeadPartCount(const ModelDims& m, bool training) {
  return training ? 2 * HeadBlockCount(m) + 2 : HeadBlockCount(m) + 1;
}
inline HeadStep HeadStepAt(const ModelDims& m, int part) {
  const int blocks = HeadBlockCount(m);
  if (part == 0) return {HeadStepKind::kNorm, 0};
  if (part <= blocks) return {HeadStepKind::kForwardBlock, part - 1};
  if (part <= 2 * blocks) return {HeadStepKind::kBackwardBlock, part - 1 - blocks};
  return {HeadStepKind::kNormBackward, 0};
}

// One pointer per layer tensor (null when the tensor does not exist).
template <typename T>
struct LayerWeightsOf {
  const T* input_norm = nullptr;
  const T* q = nullptr;
  const T* q_bias = nullptr;
  const T* q_norm = nullptr;  // qwen3: [D], every query head
  const T* k = nullptr;
  const T* k_bias = nullptr;
  const T* k_norm = nullptr;  // qwen3: [D], every key head
  const T* v = nullptr;
  const T* v_bias = nullptr;
  const T* o = nullptr;
  const T* o_bias = nullptr;
  const T* post_norm = nullptr;
  const T* gate = nullptr;
  const T* gate_bias = nullptr;
  const T* up = nullptr;
  const T* up_bias = nullptr;
  const T* down = nullptr;
  const T* down_bias = nullptr;

  const T*& operator[](TensorRole t) {
    switch (t) {
      case TensorRole::kInputNorm:
        return input_norm;
      case TensorRole::kQ:
        return q;
      case TensorRole::kQBias:
        return q_bias;
      case TensorRole::kQNorm:
        return q_norm;
      case TensorRole::kK:
        return k;
      case TensorRole::kKBias:
        return k_bias;
      case TensorRole::kKNorm:
        return k_norm;
      case TensorRole::kV:
        return v;
      case TensorRole::kVBias:
        return v_bias;
      case TensorRole::kO:
        return o;
      case TensorRole::kOBias:
        return o_bias;
      case TensorRole::kPostAttentionNorm:
        return post_norm;
      case TensorRole::kGate:
        return gate;
      case TensorRole::kGateBias:
        return gate_bias;
      case TensorRole::kUp:
        return up;
      case TensorRole::kUpBias:
        return up_bias;
      case TensorRole::kDown:
        return down;
      case TensorRole::kDownBias:
        return down_bias;
      default:  // the roles outside a layer
        break;
    }
    return down_bias;  // unreachable: every enumerator is handled
  }
  const T* operator[](TensorRole t) const { return (*const_cast<LayerWeightsOf*>(this))[t]; }
};

inline TensorRole LayerTensorAt(int i) { return static_cast<TensorRole>(i); }

// Element offset of a tensor inside the packed layer entry (-1 = absent).
inline int64_t OffsetOf(const LayerOffsets& o, TensorRole t) {
  switch (t) {
    case TensorRole::kInputNorm:
      return o.input_norm;
    case TensorRole::kQ:
      return o.q;
    case TensorRole::kQBias:
      return o.q_bias;
    case TensorRole::kQNorm:
      return o.q_norm;
    case TensorRole::kK:
      return o.k;
    case TensorRole::kKBias:
      return o.k_bias;
    case TensorRole::kKNorm:
      return o.k_norm;
    case TensorRole::kV:
      return o.v;
    case TensorRole::kVBias:
      return o.v_bias;
    case TensorRole::kO:
      return o.o;
    case TensorRole::kOBias:
      return o.o_bias;
    case TensorRole::kPostAttentionNorm:
      return o.post_norm;
    case TensorRole::kGate:
      return o.gate;
    case TensorRole::kGateBias:
      return o.gate_bias;
    case TensorRole::kUp:
      return o.up;
    case TensorRole::kUpBias:
      return o.up_bias;
    case TensorRole::kDown:
      return o.down;
    case TensorRole::kDownBias:
      return o.down_bias;
    default:  // the roles outside a layer
      break;
  }
  return -1;
}

// Elements of a tensor and of one of its rows (the unit row blocks are cut in:
// a weight matrix [out, in] has rows of `in` elements; vectors are one row).
struct TensorExtent {
  int64_t elements = 0;
  int64_t row_elements = 0;
};

inline TensorExtent ExtentOf(const ModelDims& m, TensorRole t) {
  const int64_t d = m.hidden;
  switch (t) {
    case TensorRole::kInputNorm:
    case TensorRole::kPostAttentionNorm:
    case TensorRole::kOBias:
    case TensorRole::kDownBias:
      return {d, d};
    case TensorRole::kQ:
      return {m.q_width() * d, d};
    case TensorRole::kQBias:
      return {m.q_width(), m.q_width()};
    case TensorRole::kQNorm:
    case TensorRole::kKNorm:
      return {m.head_dim, m.head_dim};
    case TensorRole::kK:
    case TensorRole::kV:
      return {m.kv_width() * d, d};
    case TensorRole::kKBias:
    case TensorRole::kVBias:
      return {m.kv_width(), m.kv_width()};
    case TensorRole::kO:
      return {d * m.q_width(), m.q_width()};
    case TensorRole::kGate:
    case TensorRole::kUp:
      return {m.ffn * d, d};
    case TensorRole::kGateBias:
    case TensorRole::kUpBias:
      return {m.ffn, m.ffn};
    case TensorRole::kDown:
      return {d * m.ffn, m.ffn};
    default:  // the roles outside a layer
      break;
  }
  return {};
}

inline const char* LayerTensorName(TensorRole t) {
  switch (t) {
    case TensorRole::kInputNorm:
      return "input_norm";
    case TensorRole::kQ:
      return "q";
    case TensorRole::kQBias:
      return "q_bias";
    case TensorRole::kQNorm:
      return "q_norm";
    case TensorRole::kK:
      return "k";
    case TensorRole::kKBias:
      return "k_bias";
    case TensorRole::kKNorm:
      return "k_norm";
    case TensorRole::kV:
      return "v";
    case TensorRole::kVBias:
      return "v_bias";
    case TensorRole::kO:
      return "o";
    case TensorRole::kOBias:
      return "o_bias";
    case TensorRole::kPostAttentionNorm:
      return "post_norm";
    case TensorRole::kGate:
      return "gate";
    case TensorRole::kGateBias:
      return "gate_bias";
    case TensorRole::kUp:
      return "up";
    case TensorRole::kUpBias:
      return "up_bias";
    case TensorRole::kDown:
      return "down";
    case TensorRole::kDownBias:
      return "down_bias";
    default:  // the roles outside a layer
      break;
  }
  return "?";
}

// The bias travelling with a matrix, or the tensor itself when it has none.
inline TensorRole BiasOf(TensorRole t) {
  switch (t) {
    case TensorRole::kQ:
      return TensorRole::kQBias;
    case TensorRole::kK:
      return TensorRole::kKBias;
    case TensorRole::kV:
      return TensorRole::kVBias;
    case TensorRole::kO:
      return TensorRole::kOBias;
    case TensorRole::kGate:
      return TensorRole::kGateBias;
    case TensorRole::kUp:
      return TensorRole::kUpBias;
    case TensorRole::kDown:
      return TensorRole::kDownBias;
    default:
      return t;
  }
}

// The per-head norm travelling with a projection (qwen3's q_norm with q,
// k_norm with k: the part that projects also normalises, forward and
// backward), or the tensor itself when it has none.
inline TensorRole HeadNormOf(TensorRole t) {
  switch (t) {
    case TensorRole::kQ:
      return TensorRole::kQNorm;
    case TensorRole::kK:
      return TensorRole::kKNorm;
    default:
      return t;
  }
}

// The tensor forward part p reads (with BiasOf and HeadNormOf it): the forward's consumption
// order input_norm, q, k, v, o, post_norm, gate, up, down.
inline TensorRole ForwardPartTensor(int part) {
  constexpr TensorRole kOrder[kLayerParts] = {
      TensorRole::kInputNorm, TensorRole::kQ,  TensorRole::kK,
      TensorRole::kV,         TensorRole::kO,  TensorRole::kPostAttentionNorm,
      TensorRole::kGate,      TensorRole::kUp, TensorRole::kDown};
  return kOrder[part];
}

// The tensor backward part p reads: CpuLayerBackward's consumption order
// down, gate, up, post_norm, o, q, k, v, input_norm.
inline TensorRole BackwardPartTensor(int part) {
  constexpr TensorRole kOrder[kLayerParts] = {
      TensorRole::kDown,     TensorRole::kGate, TensorRole::kUp,
      TensorRole::kPostAttentionNorm, TensorRole::kO,    TensorRole::kQ,
      TensorRole::kK,        TensorRole::kV,    TensorRole::kInputNorm};
  return kOrder[part];
}

// Pointers into a packed layer entry at `base`.
template <typename T>
LayerWeightsOf<T> LayerWeightsAt(const T* base, const LayerOffsets& offsets) {
  LayerWeightsOf<T> w;
  for (int i = 0; i < kLayerTensorCount; ++i) {
    const int64_t offset = OffsetOf(offsets, LayerTensorAt(i));
    w[LayerTensorAt(i)] = offset < 0 ? nullptr : base + offset;
  }
  return w;
}

// The same pointers seen as another element type.
template <typename To, typename From>
LayerWeightsOf<To> LayerWeightsAs(const LayerWeightsOf<From>& from) {
  LayerWeightsOf<To> to;
  for (int i = 0; i < kLayerTensorCount; ++i) {
    to[LayerTensorAt(i)] = static_cast<const To*>(static_cast<const void*>(from[LayerTensorAt(i)]));
  }
  return to;
}

}  // namespace megatrain::engine
