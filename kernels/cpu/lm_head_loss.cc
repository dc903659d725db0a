// LM head fused with chunked cross-entropy: logits, loss and gradients per token chunk.
#include "kernels/cpu/lm_head_loss.h"

#include <cblas.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>

#include "kernels/common/cross_entropy.h"
#include "kernels/common/softmax.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/ordered_sum.h"

namespace megatrain::kernels::cpu {
namespace {

// Turns one row of logits into its gradient in place (kernels/common/cross_entropy.h,
// with the vectorisable FastExp in place of expf); returns lse - logit[target].
double RowLossAndGradient(float* row, int64_t vocab, int32_t target, float scale) {
  assert(target >= 0 && target < vocab);
  const float target_logit = row[target];
  const float max = RowMax(row, vocab);
  const float lse = OnlineSoftmaxLogSumExp(OnlineSoftmax{max, SumExpShifted(row, vocab, max)});
  for (int64_t j = 0; j < vocab; ++j) row[j] = FastExp(row[j] - lse) * scale;
  row[target] -= scale;
  return static_cast<double>(CrossEntropyRowLoss(lse, target_logit));
}

}  // namespace

LmHeadLossResult LmHeadCrossEntropy(const float* h, const float* w, const int32_t* targets,
                                    int64_t n, int64_t d, int64_t vocab, int64_t chunk,
                                    float inv_total_valid, float* scratch, float* dh, float* dw) {
  assert(chunk > 0);
  LmHeadLossResult result;
  const int d_int = static_cast<int>(d);
  const int vocab_int = static_cast<int>(vocab);
  for (int64_t c0 = 0; c0 < n; c0 += chunk) {
    const int64_t rows = std::min(chunk, n - c0);
    const int rows_int = static_cast<int>(rows);
    const float* h_chunk = h + c0 * d;
    int64_t valid_in_chunk = 0;
    for (int64_t r = 0; r < rows; ++r) valid_in_chunk += targets[c0 + r] >= 0 ? 1 : 0;
    if (valid_in_chunk == 0) {
      if (dh != nullptr) std::memset(dh + c0 * d, 0, sizeof(float) * rows * d);
      continue;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows_int, vocab_int, d_int, 1.0f, h_chunk,
                d_int, w, d_int, 0.0f, scratch, vocab_int);
    for (int64_t r = 0; r < rows; ++r) {
      float* row = scratch + r * vocab;
      const int32_t target = targets[c0 + r];
      if (target < 0) {
        std::memset(row, 0, sizeof(float) * vocab);
        continue;
      }
      result.loss_sum += RowLossAndGradient(row, vocab, target, inv_total_valid);
    }
    result.valid_count += valid_in_chunk;
    if (dh != nullptr) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows_int, d_int, vocab_int, 1.0f,
                  scratch, vocab_int, w, d_int, 0.0f, dh + c0 * d, d_int);
    }
    if (dw != nullptr) {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, vocab_int, d_int, rows_int, 1.0f,
                  scratch, vocab_int, h_chunk, d_int, 1.0f, dw, d_int);
    }
  }
  return result;
}

void LmHeadLogits(const float* h, const float* w, int64_t n, int64_t d, int64_t vocab,
                  float* logits) {
  LinearForward(h, w, nullptr, n, d, vocab, logits);
}

}  // namespace megatrain::kernels::cpu
