// LM head fused with cross-entropy, in token chunks and vocabulary blocks so
// neither the full [tokens, vocab] logits nor the whole head at once are
// needed: a forward pass over the blocks folds each block's logits into a
// per-token running log-sum-exp (kernels/common/softmax.h), then, once every
// block has been seen, a backward pass recomputes each block's logits and
// turns them into the gradients of the hidden states and of the block's rows.
#pragma once

#include <cstdint>

namespace megatrain::kernels::cpu {

struct LmHeadLossResult {
  double loss_sum = 0.0;    // sum over valid tokens of lse - logit[target], unscaled
  int64_t valid_count = 0;  // tokens with target >= 0
};

// Per-token state of a head computed block by block ([n] floats each).
struct LmHeadRowStats {
  float* max = nullptr;           // running max of the logits seen
  float* sum = nullptr;           // running sum of exp(logit - max)
  float* target_logit = nullptr;  // the target's logit, once its block was seen
};

// Shapes shared by the functions below. h: [n, d] final-normed hidden states;
// w_block: rows [first_row, first_row + rows) of the [vocab, d] head; targets:
// [n], negative = ignored, others in [0, vocab) (the executor validates).
// Token chunks of `chunk` rows (the last may be shorter) shape the GEMMs;
// scratch holds chunk * rows floats.
struct LmHeadBlock {
  const float* h = nullptr;
  const float* w_block = nullptr;
  const int32_t* targets = nullptr;
  int64_t n = 0;
  int64_t d = 0;
  int64_t first_row = 0;
  int64_t rows = 0;
  int64_t chunk = 0;
  float* scratch = nullptr;
};

// Before the first block: empty running states.
void LmHeadResetStats(LmHeadRowStats stats, int64_t n);

// Folds the block's logits into the running states of the valid tokens.
void LmHeadBlockForward(const LmHeadBlock& block, LmHeadRowStats stats);

// After every block's forward: the loss, adding rows in increasing order in
// a double.
LmHeadLossResult LmHeadLossFromStats(LmHeadRowStats stats, const int32_t* targets, int64_t n);

// After every block's forward, per block: with dlogits = (softmax -
// onehot(target)) * inv_total_valid on valid rows and zero on ignored ones,
//   dh       = dlogits * w_block   (OVERWRITES when first_block, else ADDS)
//   dw_block = dlogits^T * h       (OVERWRITES: [rows, d], chunks added in order)
void LmHeadBlockBackward(const LmHeadBlock& block, LmHeadRowStats stats, float inv_total_valid,
                         bool first_block, float* dh, float* dw_block);

// Columns [first_row, first_row + rows) of logits[n, vocab] = h * w^T.
void LmHeadBlockLogits(const LmHeadBlock& block, int64_t vocab, float* logits);

// The whole head in one call, as blocks of block_rows (0 = one block):
// scratch holds chunk * min(block_rows, vocab) floats; dh and dw ([vocab, d],
// OVERWRITTEN) may both be null for a loss-only pass.
LmHeadLossResult LmHeadCrossEntropy(const float* h, const float* w, const int32_t* targets,
                                    int64_t n, int64_t d, int64_t vocab, int64_t chunk,
                                    int64_t block_rows, float inv_total_valid, float* scratch,
                                    float* dh, float* dw);

// logits[n, vocab] = h[n, d] * w[vocab, d]^T, for tests and evaluation of
// small batches (the same as LinearForward without bias).
void LmHeadLogits(const float* h, const float* w, int64_t n, int64_t d, int64_t vocab,
                  float* logits);

}  // namespace megatrain::kernels::cpu
