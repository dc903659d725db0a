// LM head fused with cross-entropy, by token chunk and vocabulary block.
#include "kernels/cpu/lm_head_loss.h"

#include <cblas.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/common/cross_entropy.h"
#include "kernels/common/softmax.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/ordered_sum.h"

namespace megatrain::kernels::cpu {
namespace {

int64_t ValidRows(const int32_t* targets, int64_t rows) {
  int64_t valid = 0;
  for (int64_t r = 0; r < rows; ++r) valid += targets[r] >= 0 ? 1 : 0;
  return valid;
}

// scratch[rows_in_chunk, block.rows] = h_chunk * w_block^T.
void ChunkLogits(const LmHeadBlock& b, int64_t c0, int64_t rows_in_chunk) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows_in_chunk),
              static_cast<int>(b.rows), static_cast<int>(b.d), 1.0f, b.h + c0 * b.d,
              static_cast<int>(b.d), b.w_block, static_cast<int>(b.d), 0.0f, b.scratch,
              static_cast<int>(b.rows));
}

bool TargetInBlock(const LmHeadBlock& b, int32_t target) {
  return target >= b.first_row && target < b.first_row + b.rows;
}

}  // namespace

void LmHeadResetStats(LmHeadRowStats stats, int64_t n) {
  for (int64_t t = 0; t < n; ++t) {
    stats.max[t] = -INFINITY;
    stats.sum[t] = 0.0f;
    stats.target_logit[t] = NAN;  // a valid target's block always sets it
  }
}

void LmHeadBlockForward(const LmHeadBlock& b, LmHeadRowStats stats) {
  assert(b.chunk > 0);
  for (int64_t c0 = 0; c0 < b.n; c0 += b.chunk) {
    const int64_t rows_in_chunk = std::min(b.chunk, b.n - c0);
    if (ValidRows(b.targets + c0, rows_in_chunk) == 0) continue;
    ChunkLogits(b, c0, rows_in_chunk);
    for (int64_t r = 0; r < rows_in_chunk; ++r) {
      const int64_t t = c0 + r;
      const int32_t target = b.targets[t];
      if (target < 0) continue;
      const float* row = b.scratch + r * b.rows;
      const float max = RowMax(row, b.rows);
      OnlineSoftmax state{stats.max[t], stats.sum[t]};
      OnlineSoftmaxMerge(&state, max, SumExpShifted(row, b.rows, max));
      stats.max[t] = state.max;
      stats.sum[t] = state.sum;
      if (TargetInBlock(b, target)) stats.target_logit[t] = row[target - b.first_row];
    }
  }
}

LmHeadLossResult LmHeadLossFromStats(LmHeadRowStats stats, const int32_t* targets, int64_t n) {
  LmHeadLossResult result;
  for (int64_t t = 0; t < n; ++t) {
    if (targets[t] < 0) continue;
    const float lse = OnlineSoftmaxLogSumExp(OnlineSoftmax{stats.max[t], stats.sum[t]});
    result.loss_sum += static_cast<double>(CrossEntropyRowLoss(lse, stats.target_logit[t]));
    ++result.valid_count;
  }
  return result;
}

void LmHeadBlockBackward(const LmHeadBlock& b, LmHeadRowStats stats, float inv_total_valid,
                         bool first_block, float* dh, float* dw_block) {
  assert(b.chunk > 0);
  const int d = static_cast<int>(b.d);
  const int block_rows = static_cast<int>(b.rows);
  std::memset(dw_block, 0, sizeof(float) * b.rows * b.d);
  for (int64_t c0 = 0; c0 < b.n; c0 += b.chunk) {
    const int64_t rows_in_chunk = std::min(b.chunk, b.n - c0);
    const int chunk_int = static_cast<int>(rows_in_chunk);
    if (ValidRows(b.targets + c0, rows_in_chunk) == 0) {
      if (first_block) std::memset(dh + c0 * b.d, 0, sizeof(float) * rows_in_chunk * b.d);
      continue;
    }
    ChunkLogits(b, c0, rows_in_chunk);
    for (int64_t r = 0; r < rows_in_chunk; ++r) {
      float* row = b.scratch + r * b.rows;
      const int64_t t = c0 + r;
      const int32_t target = b.targets[t];
      if (target < 0) {
        std::memset(row, 0, sizeof(float) * b.rows);
        continue;
      }
      // kernels/common/cross_entropy.h's gradient with the vectorisable FastExp.
      const float lse = OnlineSoftmaxLogSumExp(OnlineSoftmax{stats.max[t], stats.sum[t]});
      for (int64_t j = 0; j < b.rows; ++j) row[j] = FastExp(row[j] - lse) * inv_total_valid;
      if (TargetInBlock(b, target)) row[target - b.first_row] -= inv_total_valid;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, chunk_int, d, block_rows, 1.0f,
                b.scratch, block_rows, b.w_block, d, first_block ? 0.0f : 1.0f, dh + c0 * b.d, d);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, block_rows, d, chunk_int, 1.0f, b.scratch,
                block_rows, b.h + c0 * b.d, d, 1.0f, dw_block, d);
  }
}

void LmHeadBlockLogits(const LmHeadBlock& b, int64_t vocab, float* logits) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(b.n),
              static_cast<int>(b.rows), static_cast<int>(b.d), 1.0f, b.h, static_cast<int>(b.d),
              b.w_block, static_cast<int>(b.d), 0.0f, logits + b.first_row,
              static_cast<int>(vocab));
}

LmHeadLossResult LmHeadCrossEntropy(const float* h, const float* w, const int32_t* targets,
                                    int64_t n, int64_t d, int64_t vocab, int64_t chunk,
                                    int64_t block_rows, float inv_total_valid, float* scratch,
                                    float* dh, float* dw) {
  assert((dh == nullptr) == (dw == nullptr));
  const int64_t rows = block_rows > 0 && block_rows < vocab ? block_rows : vocab;
  std::vector<float> max(static_cast<size_t>(n)), sum(static_cast<size_t>(n)),
      target_logit(static_cast<size_t>(n));
  const LmHeadRowStats stats{max.data(), sum.data(), target_logit.data()};
  LmHeadResetStats(stats, n);
  auto block_at = [&](int64_t first) {
    return LmHeadBlock{h, w + first * d, targets, n, d, first, std::min(rows, vocab - first),
                       chunk, scratch};
  };
  for (int64_t first = 0; first < vocab; first += rows) LmHeadBlockForward(block_at(first), stats);
  if (dh != nullptr) {
    for (int64_t first = 0; first < vocab; first += rows) {
      LmHeadBlockBackward(block_at(first), stats, inv_total_valid, first == 0, dh, dw + first * d);
    }
  }
  return LmHeadLossFromStats(stats, targets, n);
}

void LmHeadLogits(const float* h, const float* w, int64_t n, int64_t d, int64_t vocab,
                  float* logits) {
  LinearForward(h, w, nullptr, n, d, vocab, logits);
}

}  // namespace megatrain::kernels::cpu
