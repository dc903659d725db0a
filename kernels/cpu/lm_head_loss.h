// LM head fused with cross-entropy, in token chunks so the full [tokens, vocab]
// logits never exist: per chunk one GEMM for the logits, a row-wise softmax,
// and two GEMMs for the gradients of the hidden states and of the head weight.
#pragma once

#include <cstdint>

namespace megatrain::kernels::cpu {

struct LmHeadLossResult {
  double loss_sum = 0.0;    // sum over valid tokens of lse - logit[target], unscaled
  int64_t valid_count = 0;  // tokens with target >= 0
};

// h: [n, d] final-normed hidden states; w: [vocab, d]; targets: [n], a
// negative target marks an ignored token, others lie in [0, vocab) (the
// executor validates). Chunks of `chunk` rows (the last may be shorter; the
// chunk is fixed by the caller, it shapes the dW GEMMs). scratch: chunk * vocab
// floats from the caller.
// Per valid row: dlogits = (softmax - onehot(target)) * inv_total_valid;
// ignored rows get zero gradient. Then
//   dh[chunk rows] = dlogits * w   (OVERWRITES; zero rows for ignored tokens)
//   dw            += dlogits^T * h_chunk   (ACCUMULATES, chunks in order)
// dh and dw may both be null for a loss-only (evaluation) pass.
// loss_sum adds rows in increasing order in a double.
LmHeadLossResult LmHeadCrossEntropy(const float* h, const float* w, const int32_t* targets,
                                    int64_t n, int64_t d, int64_t vocab, int64_t chunk,
                                    float inv_total_valid, float* scratch, float* dh, float* dw);

// logits[n, vocab] = h[n, d] * w[vocab, d]^T, for tests and evaluation of
// small batches (the same as LinearForward without bias).
void LmHeadLogits(const float* h, const float* w, int64_t n, int64_t d, int64_t vocab,
                  float* logits);

}  // namespace megatrain::kernels::cpu
