// Fragmented weight streaming's vocabulary: a decoder layer's tensors, the
// per-tensor weight pointers the layer math reads, and the parts a layer's
// forward, backward and the head run as (each part reads one tensor with its
// bias; the head's parts read the final norm, then the LM head's vocabulary
// blocks once for the loss and once more for the gradients).
#pragma once

#include <cstdint>

#include "engine/exec/model_dims.h"

namespace megatrain::engine {

enum class LayerTensor : int {
  kInputNorm,
  kQ,
  kQBias,
  kK,
  kKBias,
  kV,
  kVBias,
  kO,
  kOBias,
  kPostNorm,
  kGate,
  kGateBias,
  kUp,
  kUpBias,
  kDown,
  kDownBias,
};
inline constexpr int kLayerTensorCount = 16;

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
  const T* k = nullptr;
  const T* k_bias = nullptr;
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

  const T*& operator[](LayerTensor t) {
    switch (t) {
      case LayerTensor::kInputNorm:
        return input_norm;
      case LayerTensor::kQ:
        return q;
      case LayerTensor::kQBias:
        return q_bias;
      case LayerTensor::kK:
        return k;
      case LayerTensor::kKBias:
        return k_bias;
      case LayerTensor::kV:
        return v;
      case LayerTensor::kVBias:
        return v_bias;
      case LayerTensor::kO:
        return o;
      case LayerTensor::kOBias:
        return o_bias;
      case LayerTensor::kPostNorm:
        return post_norm;
      case LayerTensor::kGate:
        return gate;
      case LayerTensor::kGateBias:
        return gate_bias;
      case LayerTensor::kUp:
        return up;
      case LayerTensor::kUpBias:
        return up_bias;
      case LayerTensor::kDown:
        return down;
      case LayerTensor::kDownBias:
        return down_bias;
    }
    return down_bias;  // unreachable: every enumerator is handled
  }
  const T* operator[](LayerTensor t) const { return (*const_cast<LayerWeightsOf*>(this))[t]; }
};

inline LayerTensor LayerTensorAt(int i) { return static_cast<LayerTensor>(i); }

// Element offset of a tensor inside the packed layer entry (-1 = absent).
inline int64_t OffsetOf(const LayerOffsets& o, LayerTensor t) {
  switch (t) {
    case LayerTensor::kInputNorm:
      return o.input_norm;
    case LayerTensor::kQ:
      return o.q;
    case LayerTensor::kQBias:
      return o.q_bias;
    case LayerTensor::kK:
      return o.k;
    case LayerTensor::kKBias:
      return o.k_bias;
    case LayerTensor::kV:
      return o.v;
    case LayerTensor::kVBias:
      return o.v_bias;
    case LayerTensor::kO:
      return o.o;
    case LayerTensor::kOBias:
      return o.o_bias;
    case LayerTensor::kPostNorm:
      return o.post_norm;
    case LayerTensor::kGate:
      return o.gate;
    case LayerTensor::kGateBias:
      return o.gate_bias;
    case LayerTensor::kUp:
      return o.up;
    case LayerTensor::kUpBias:
      return o.up_bias;
    case LayerTensor::kDown:
      return o.down;
    case LayerTensor::kDownBias:
      return o.down_bias;
  }
  return -1;
}

// Elements of a tensor and of one of its rows (the unit row blocks are cut in:
// a weight matrix [out, in] has rows of `in` elements; vectors are one row).
struct TensorExtent {
  int64_t elements = 0;
  int64_t row_elements = 0;
};

inline TensorExtent ExtentOf(const ModelDims& m, LayerTensor t) {
  const int64_t d = m.hidden;
  switch (t) {
    case LayerTensor::kInputNorm:
    case LayerTensor::kPostNorm:
    case LayerTensor::kOBias:
    case LayerTensor::kDownBias:
      return {d, d};
    case LayerTensor::kQ:
      return {m.q_width() * d, d};
    case LayerTensor::kQBias:
      return {m.q_width(), m.q_width()};
    case LayerTensor::kK:
    case LayerTensor::kV:
      return {m.kv_width() * d, d};
    case LayerTensor::kKBias:
    case LayerTensor::kVBias:
      return {m.kv_width(), m.kv_width()};
    case LayerTensor::kO:
      return {d * m.q_width(), m.q_width()};
    case LayerTensor::kGate:
    case LayerTensor::kUp:
      return {m.ffn * d, d};
    case LayerTensor::kGateBias:
    case LayerTensor::kUpBias:
      return {m.ffn, m.ffn};
    case LayerTensor::kDown:
      return {d * m.ffn, m.ffn};
  }
  return {};
}

inline const char* LayerTensorName(LayerTensor t) {
  switch (t) {
    case LayerTensor::kInputNorm:
      return "input_norm";
    case LayerTensor::kQ:
      return "q";
    case LayerTensor::kQBias:
      return "q_bias";
    case LayerTensor::kK:
      return "k";
    case LayerTensor::kKBias:
      return "k_bias";
    case LayerTensor::kV:
      return "v";
    case LayerTensor::kVBias:
      return "v_bias";
    case LayerTensor::kO:
      return "o";
    case LayerTensor::kOBias:
      return "o_bias";
    case LayerTensor::kPostNorm:
      return "post_norm";
    case LayerTensor::kGate:
      return "gate";
    case LayerTensor::kGateBias:
      return "gate_bias";
    case LayerTensor::kUp:
      return "up";
    case LayerTensor::kUpBias:
      return "up_bias";
    case LayerTensor::kDown:
      return "down";
    case LayerTensor::kDownBias:
      return "down_bias";
  }
  return "?";
}

// The bias travelling with a matrix, or the tensor itself when it has none.
inline LayerTensor BiasOf(LayerTensor t) {
  switch (t) {
    case LayerTensor::kQ:
      return LayerTensor::kQBias;
    case LayerTensor::kK:
      return LayerTensor::kKBias;
    case LayerTensor::kV:
      return LayerTensor::kVBias;
    case LayerTensor::kO:
      return LayerTensor::kOBias;
    case LayerTensor::kGate:
      return LayerTensor::kGateBias;
    case LayerTensor::kUp:
      return LayerTensor::kUpBias;
    case LayerTensor::kDown:
      return LayerTensor::kDownBias;
    default:
      return t;
  }
}

// The tensor forward part p reads (with BiasOf it): the forward's consumption
// order input_norm, q, k, v, o, post_norm, gate, up, down.
inline LayerTensor ForwardPartTensor(int part) {
  constexpr LayerTensor kOrder[kLayerParts] = {
      LayerTensor::kInputNorm, LayerTensor::kQ,  LayerTensor::kK,
      LayerTensor::kV,         LayerTensor::kO,  LayerTensor::kPostNorm,
      LayerTensor::kGate,      LayerTensor::kUp, LayerTensor::kDown};
  return kOrder[part];
}

// The tensor backward part p reads: CpuLayerBackward's consumption order
// down, gate, up, post_norm, o, q, k, v, input_norm.
inline LayerTensor BackwardPartTensor(int part) {
  constexpr LayerTensor kOrder[kLayerParts] = {
      LayerTensor::kDown,     LayerTensor::kGate, LayerTensor::kUp,
      LayerTensor::kPostNorm, LayerTensor::kO,    LayerTensor::kQ,
      LayerTensor::kK,        LayerTensor::kV,    LayerTensor::kInputNorm};
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
