// The math of one Llama-family decoder layer, the embedding and the head on
// the CPU device, over kernels/cpu: forward (saving what backward needs),
// backward (accumulating weight gradients into the entry's packed gradient
// buffer, which has the same layout as the weights).
#pragma once

#include <cstdint>
#include <optional>

#include "engine/common/thread_pool.h"
#include "engine/exec/activation_sets.h"
#include "engine/exec/fragment_parts.h"
#include "engine/exec/model_dims.h"
#include "kernels/cpu/rope.h"

namespace megatrain::engine {

struct LayerContext {
  const ModelDims* dims = nullptr;
  const LayerOffsets* offsets = nullptr;
  const kernels::cpu::RopeTable* rope = nullptr;
  const int32_t* positions = nullptr;    // [N]: position of each token in its sequence
  float* attention_workspace = nullptr;  // AttentionWorkspaceFloats(dims)
  // Runs the sequences of the micro-batch through attention in parallel (each
  // sequence is independent, so results do not depend on it); null = serial.
  ThreadPool* pool = nullptr;
  // [N]: segment id of each token (packed samples: non-decreasing along each sequence; a query
  // sees only keys of its own segment); null = one segment per sequence.
  const int32_t* segments = nullptr;
};

using LayerWeights = LayerWeightsOf<float>;

// x_out = layer(x_in); `act` receives everything backward needs (act.x_in is
// filled with a copy of x_in). x_out may not alias x_in. `weights` is the
// packed entry (ctx.offsets); the LayerWeights form reads each tensor through
// its own pointer. Both are the kLayerParts forward parts run back to back.
void CpuLayerForward(const LayerContext& ctx, const float* weights, const float* x_in,
                     LayerActivations& act, float* x_out);
void CpuLayerForward(const LayerContext& ctx, const LayerWeights& weights, const float* x_in,
                     LayerActivations& act, float* x_out);
// Forward part `part` (0..kLayerParts-1): reads only ForwardPartTensor(part)
// and its bias; parts run in order on one thread.
void CpuLayerForwardPart(const LayerContext& ctx, int part, const LayerWeights& weights,
                         const float* x_in, LayerActivations& act, float* x_out);

// dx_in = d loss / d x_in given dx_out, from the saved activations; weight
// gradients are ADDED into `grads` (packed like the layer entry: ctx.offsets).
void CpuLayerBackward(const LayerContext& ctx, const float* weights, const LayerActivations& act,
                      LayerBackwardScratch& scratch, const float* dx_out, float* dx_in,
                      float* grads);
void CpuLayerBackward(const LayerContext& ctx, const LayerWeights& weights,
                      const LayerActivations& act, LayerBackwardScratch& scratch,
                      const float* dx_out, float* dx_in, float* grads);
// Backward part `part`: reads only BackwardPartTensor(part) and its bias.
void CpuLayerBackwardPart(const LayerContext& ctx, int part, const LayerWeights& weights,
                          const LayerActivations& act, LayerBackwardScratch& scratch,
                          const float* dx_out, float* dx_in, float* grads);

// Sizes of the attention workspace the kernels need for these dims (one
// slice per sequence of the micro-batch).
size_t AttentionWorkspaceFloats(const ModelDims& dims);

// Result of the fused head for one micro-batch.
struct HeadResult {
  double loss_sum = 0.0;  // sum of -log p(target) over valid tokens
  int64_t valid_tokens = 0;
};

// Pointers of one head step. Block steps read lm_block, the [rows, d] rows of
// their vocabulary block, and a training backward block writes lm_block_grad
// ([rows, d], OVERWRITTEN); the final norm's backward overwrites dx_final and
// final_norm_grad. dx_final = d(loss)/d(x_final) with loss = loss_sum *
// inv_total_valid.
struct CpuHeadArgs {
  HeadForm form = HeadForm::kTrain;
  const float* final_norm = nullptr;
  const float* lm_block = nullptr;
  const float* x_final = nullptr;
  const int32_t* targets = nullptr;
  float inv_total_valid = 0.0f;
  float* dx_final = nullptr;
  float* final_norm_grad = nullptr;
  float* lm_block_grad = nullptr;
  float* logits = nullptr;  // kLogits: [N, vocab]
};

// One step of the head (fragment_parts.h HeadStepAt): the final norm, a
// block's forward, a block's backward, the final norm's backward. The last
// forward block returns the micro-batch's loss (kTrain and kLoss).
std::optional<HeadResult> CpuHeadStep(const ModelDims& dims, HeadStep step,
                                      const CpuHeadArgs& args, HeadScratch& scratch);

// The whole head, every step in order, with lm_head ([vocab, d]) and
// lm_head_grad (OVERWRITTEN) whole; the same bits as the steps one by one.
HeadResult CpuHead(const ModelDims& dims, CpuHeadArgs args, const float* lm_head,
                   float* lm_head_grad, HeadScratch& scratch);

}  // namespace megatrain::engine
