// Bodies of the CUDA cross-entropy kernels, templated on the storage policy S
// (see thread_bodies.h): cross_entropy.cu runs them on bf16, block_bodies_test
// under the host block emulator. Row bodies: block b owns row b, `scratch` is
// the kernel's __shared__ array of kThreads / 32 entries. Per-row bodies (the
// vocabulary-block bookkeeping) take their row index like thread_bodies.h.
//
// Ignored rows (target < 0) get loss 0 and zero gradient; a target >= vocab
// (a caller bug a kernel cannot report) gets a NaN loss so the non-finite
// check catches it, and zero gradient.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/cross_entropy.h"
#include "kernels/common/host_device.h"
#include "kernels/common/softmax.h"
#include "kernels/cuda/block_reduce.h"
#include "kernels/cuda/device_shim.h"
#include "kernels/cuda/launch_geometry.h"

namespace megatrain::kernels::cuda {

// Log-sum-exp of the row by merging OnlineSoftmax states, then dlogits and
// the row loss. dlogits may alias logits: each element is read and then
// written by the same thread.
template <class S, int kThreads>
MT_DEVICE void CrossEntropyRow(const typename S::T* logits, const int32_t* targets, int64_t vocab,
                               float scale, typename S::T* dlogits, float* row_loss,
                               OnlineSoftmax* scratch) {
  const int64_t row = MT_BLOCK_X();
  const typename S::T* in = logits + row * vocab;
  typename S::T* out = dlogits + row * vocab;
  const int64_t target = targets[row];
  const bool valid = target >= 0 && target < vocab;
  if (!valid) {
    for (int64_t c = RowFirstColumn(MT_THREAD_X()); c < vocab; c += RowColumnStride(kThreads)) {
      out[c] = S::Make(0.0f);
    }
    if (MT_THREAD_X() == 0) row_loss[row] = target < 0 ? 0.0f : NAN;
    return;  // uniform across the block: no barrier is skipped by only some threads
  }
  OnlineSoftmax state;
  for (int64_t c = RowFirstColumn(MT_THREAD_X()); c < vocab; c += RowColumnStride(kThreads)) {
    OnlineSoftmaxMerge(&state, S::Load(in[c]), 1.0f);
  }
  state = BlockSoftmaxMerge<kThreads>(state, scratch);
  const float lse = OnlineSoftmaxLogSumExp(state);
  // Read the target logit before any thread overwrites it (in-place case).
  const float target_logit = S::Load(in[target]);
  MT_SYNC_THREADS();
  for (int64_t c = RowFirstColumn(MT_THREAD_X()); c < vocab; c += RowColumnStride(kThreads)) {
    out[c] = S::Make(CrossEntropyLogitGrad(S::Load(in[c]), lse, c == target, scale));
  }
  if (MT_THREAD_X() == 0) row_loss[row] = CrossEntropyRowLoss(lse, target_logit);
}

// One block: *total = the n values summed in a fixed order (thread t adds
// t, t + kThreads, ...; the block then folds the threads).
template <int kThreads>
MT_DEVICE void OrderedSumBlock(const float* values, int64_t n, float* total, float* scratch) {
  float sum = 0.0f;
  for (int64_t i = MT_THREAD_X(); i < n; i += kThreads) sum += values[i];
  sum = BlockSum<kThreads>(sum, scratch);
  if (MT_THREAD_X() == 0) *total = sum;
}

// One block per row of a vocabulary block's logits [rows, block_vocab]: the
// block's own state merged into the row's running state; the target's logit
// kept when it lies in the block. Ignored rows are skipped.
template <class S, int kThreads>
MT_DEVICE void HeadBlockStatsRow(const typename S::T* logits, const int32_t* targets,
                                 int64_t block_vocab, int64_t first_row, float* row_max,
                                 float* row_sum, float* target_logit, OnlineSoftmax* scratch) {
  const int64_t row = MT_BLOCK_X();
  const int64_t target = targets[row];
  if (target < 0) return;  // uniform across the block
  const typename S::T* in = logits + row * block_vocab;
  OnlineSoftmax state;
  for (int64_t c = RowFirstColumn(MT_THREAD_X()); c < block_vocab; c += RowColumnStride(kThreads)) {
    OnlineSoftmaxMerge(&state, S::Load(in[c]), 1.0f);
  }
  state = BlockSoftmaxMerge<kThreads>(state, scratch);
  if (MT_THREAD_X() != 0) return;
  OnlineSoftmax running{row_max[row], row_sum[row]};
  OnlineSoftmaxMerge(&running, state.max, state.sum);
  row_max[row] = running.max;
  row_sum[row] = running.sum;
  if (target >= first_row && target < first_row + block_vocab) {
    target_logit[row] = S::Load(in[target - first_row]);
  }
}

// dlogits of one vocabulary block from the rows' final states; may alias logits.
template <class S, int kThreads>
MT_DEVICE void HeadBlockGradRow(const typename S::T* logits, const int32_t* targets,
                                int64_t block_vocab, int64_t first_row, const float* row_max,
                                const float* row_sum, float scale, typename S::T* dlogits) {
  const int64_t row = MT_BLOCK_X();
  const typename S::T* in = logits + row * block_vocab;
  typename S::T* out = dlogits + row * block_vocab;
  const int64_t target = targets[row];
  if (target < 0) {
    for (int64_t c = RowFirstColumn(MT_THREAD_X()); c < block_vocab;
         c += RowColumnStride(kThreads)) {
      out[c] = S::Make(0.0f);
    }
    return;
  }
  const float lse = OnlineSoftmaxLogSumExp(OnlineSoftmax{row_max[row], row_sum[row]});
  for (int64_t c = RowFirstColumn(MT_THREAD_X()); c < block_vocab; c += RowColumnStride(kThreads)) {
    out[c] = S::Make(CrossEntropyLogitGrad(S::Load(in[c]), lse, c + first_row == target, scale));
  }
}

// Before the first vocabulary block: an empty running state; a target logit
// no block sets stays NaN (a target outside the vocabulary), which the loss
// carries.
MT_HD void HeadStatsResetThread(int64_t row, int64_t rows, float* row_max, float* row_sum,
                                float* target_logit) {
  if (row >= rows) return;
  row_max[row] = -INFINITY;
  row_sum[row] = 0.0f;
  target_logit[row] = NAN;
}

MT_HD void HeadRowLossThread(int64_t row, int64_t rows, const float* row_max, const float* row_sum,
                             const float* target_logit, const int32_t* targets, float* row_loss) {
  if (row >= rows) return;
  if (targets[row] < 0) {
    row_loss[row] = 0.0f;
    return;
  }
  const float lse = OnlineSoftmaxLogSumExp(OnlineSoftmax{row_max[row], row_sum[row]});
  row_loss[row] = CrossEntropyRowLoss(lse, target_logit[row]);
}

}  // namespace megatrain::kernels::cuda
