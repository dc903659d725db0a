// Validation and error mapping around the CUDA launchers (see ops.h).
#include "kernels/cuda/ops.h"

#include <initializer_list>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/common/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/launch_geometry.h"
#include "kernels/cuda/launchers.h"

namespace megatrain::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;

const bf16* Bf16(const void* p) { return static_cast<const bf16*>(p); }
bf16* Bf16(void* p) { return static_cast<bf16*>(p); }

absl::Status CheckStream(cudaStream_t stream, absl::string_view op) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": stream is a default stream; pass a created stream"));
  }
  return absl::OkStatus();
}

absl::Status CheckPositive(int64_t value, absl::string_view name, absl::string_view op) {
  if (value <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " = ", value, " must be > 0"));
  }
  return absl::OkStatus();
}

absl::Status CheckNonNegative(int64_t value, absl::string_view name, absl::string_view op) {
  if (value < 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " = ", value, " must be >= 0"));
  }
  return absl::OkStatus();
}

absl::Status CheckPointer(const void* p, absl::string_view name, absl::string_view op) {
  if (p == nullptr) return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " is null"));
  return absl::OkStatus();
}

absl::Status CheckGrid(const LaunchShape& shape, absl::string_view op) {
  if (shape.blocks_x > kMaxGridX || shape.blocks_y > kMaxGridY) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": problem too large for one launch (grid ",
                                                   shape.blocks_x, " x ", shape.blocks_y, ")"));
  }
  return absl::OkStatus();
}

// Element-wise ops share their checks: stream, n >= 0, non-null tensors.
absl::Status CheckElementwise(
    absl::string_view op, cudaStream_t stream, int64_t n,
    std::initializer_list<std::pair<const void*, absl::string_view>> ptrs) {
  MT_RETURN_IF_ERROR(CheckStream(stream, op));
  MT_RETURN_IF_ERROR(CheckNonNegative(n, "n", op));
  if (n == 0) return absl::OkStatus();
  for (const auto& [p, name] : ptrs) MT_RETURN_IF_ERROR(CheckPointer(p, name, op));
  return CheckGrid(ElementwiseGrid(n), op);
}

// The vocabulary-block cross-entropy ops share theirs: stream, rows >= 0, a
// non-empty block at a non-negative row, non-null tensors, a row grid.
absl::Status CheckHeadBlock(absl::string_view op, cudaStream_t stream, int64_t rows,
                            int64_t block_vocab, int64_t first_row,
                            std::initializer_list<std::pair<const void*, absl::string_view>> ptrs) {
  MT_RETURN_IF_ERROR(CheckStream(stream, op));
  MT_RETURN_IF_ERROR(CheckNonNegative(rows, "rows", op));
  MT_RETURN_IF_ERROR(CheckPositive(block_vocab, "block_vocab", op));
  MT_RETURN_IF_ERROR(CheckNonNegative(first_row, "first_row", op));
  if (rows == 0) return absl::OkStatus();
  for (const auto& [p, name] : ptrs) MT_RETURN_IF_ERROR(CheckPointer(p, name, op));
  return CheckGrid(RowGrid(rows), op);
}

}  // namespace

absl::Status EmbeddingForward(const int32_t* ids, int64_t tokens, const void* table, int64_t vocab,
                              int dim, void* out, cudaStream_t stream) {
  constexpr absl::string_view kOp = "EmbeddingForward";
  MT_RETURN_IF_ERROR(CheckStream(stream, kOp));
  MT_RETURN_IF_ERROR(CheckNonNegative(tokens, "tokens", kOp));
  MT_RETURN_IF_ERROR(CheckPositive(vocab, "vocab", kOp));
  MT_RETURN_IF_ERROR(CheckPositive(dim, "dim", kOp));
  if (tokens == 0) return absl::OkStatus();
  MT_RETURN_IF_ERROR(CheckPointer(ids, "ids", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(table, "table", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(out, "out", kOp));
  MT_RETURN_IF_ERROR(CheckGrid(ElementwiseGrid(tokens * dim), kOp));
  return CudaStatus(
      launch::EmbeddingForward(ids, tokens, Bf16(table), vocab, dim, Bf16(out), stream), kOp);
}

absl::Status EmbeddingBackward(const int32_t* unique_rows, const int32_t* segment_offsets,
                               const int32_t* token_order, int64_t unique_count, int64_t tokens,
                               const void* dout, int dim, float* dtable, cudaStream_t stream) {
  constexpr absl::string_view kOp = "EmbeddingBackward";
  MT_RETURN_IF_ERROR(CheckStream(stream, kOp));
  MT_RETURN_IF_ERROR(CheckNonNegative(unique_count, "unique_count", kOp));
  MT_RETURN_IF_ERROR(CheckNonNegative(tokens, "tokens", kOp));
  MT_RETURN_IF_ERROR(CheckPositive(dim, "dim", kOp));
  if (unique_count > tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": unique_count = ", unique_count, " exceeds tokens = ", tokens));
  }
  if (unique_count == 0) return absl::OkStatus();
  MT_RETURN_IF_ERROR(CheckPointer(unique_rows, "unique_rows", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(segment_offsets, "segment_offsets", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(token_order, "token_order", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(dout, "dout", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(dtable, "dtable", kOp));
  MT_RETURN_IF_ERROR(CheckGrid(EmbeddingBackwardGrid(unique_count, dim), kOp));
  return CudaStatus(launch::EmbeddingBackward(unique_rows, segment_offsets, token_order,
                                              unique_count, Bf16(dout), dim, dtable, stream),
                    kOp);
}

absl::Status ResidualAdd(const void* a, const void* b, void* out, int64_t n, cudaStream_t stream) {
  constexpr absl::string_view kOp = "ResidualAdd";
  MT_RETURN_IF_ERROR(CheckElementwise(kOp, stream, n, {{a, "a"}, {b, "b"}, {out, "out"}}));
  if (n == 0) return absl::OkStatus();
  return CudaStatus(launch::ResidualAdd(Bf16(a), Bf16(b), Bf16(out), n, stream), kOp);
}

absl::Status AccumulateFp32(const float* g, float* sum, int64_t n, cudaStream_t stream) {
  constexpr absl::string_view kOp = "AccumulateFp32";
  MT_RETURN_IF_ERROR(CheckElementwise(kOp, stream, n, {{g, "g"}, {sum, "sum"}}));
  if (n == 0) return absl::OkStatus();
  return CudaStatus(launch::AccumulateFp32(g, sum, n, stream), kOp);
}

absl::Status RoundToBf16(const float* in, void* out, int64_t n, cudaStream_t stream) {
  constexpr absl::string_view kOp = "RoundToBf16";
  MT_RETURN_IF_ERROR(CheckElementwise(kOp, stream, n, {{in, "in"}, {out, "out"}}));
  if (n == 0) return absl::OkStatus();
  return CudaStatus(launch::RoundToBf16(in, Bf16(out), n, stream), kOp);
}

absl::Status SwigluForward(const void* gate, const void* up, void* out, int64_t n,
                           cudaStream_t stream) {
  constexpr absl::string_view kOp = "SwigluForward";
  MT_RETURN_IF_ERROR(CheckElementwise(kOp, stream, n, {{gate, "gate"}, {up, "up"}, {out, "out"}}));
  if (n == 0) return absl::OkStatus();
  return CudaStatus(launch::SwigluForward(Bf16(gate), Bf16(up), Bf16(out), n, stream), kOp);
}

absl::Status SwigluBackward(const void* gate, const void* up, const void* dy, void* d_gate,
                            void* d_up, int64_t n, cudaStream_t stream) {
  constexpr absl::string_view kOp = "SwigluBackward";
  MT_RETURN_IF_ERROR(CheckElementwise(
      kOp, stream, n,
      {{gate, "gate"}, {up, "up"}, {dy, "dy"}, {d_gate, "d_gate"}, {d_up, "d_up"}}));
  if (n == 0) return absl::OkStatus();
  return CudaStatus(
      launch::SwigluBackward(Bf16(gate), Bf16(up), Bf16(dy), Bf16(d_gate), Bf16(d_up), n, stream),
      kOp);
}

absl::Status RopeInPlace(void* x, int64_t tokens, int heads, int head_dim, int seq,
                         const float* cos_table, const float* sin_table, bool backward,
                         cudaStream_t stream, const int32_t* positions) {
  constexpr absl::string_view kOp = "RopeInPlace";
  MT_RETURN_IF_ERROR(CheckStream(stream, kOp));
  MT_RETURN_IF_ERROR(CheckNonNegative(tokens, "tokens", kOp));
  MT_RETURN_IF_ERROR(CheckPositive(heads, "heads", kOp));
  MT_RETURN_IF_ERROR(CheckPositive(head_dim, "head_dim", kOp));
  MT_RETURN_IF_ERROR(CheckPositive(seq, "seq", kOp));
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": head_dim = ", head_dim, " must be even"));
  }
  if (tokens == 0) return absl::OkStatus();
  MT_RETURN_IF_ERROR(CheckPointer(x, "x", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(cos_table, "cos_table", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(sin_table, "sin_table", kOp));
  MT_RETURN_IF_ERROR(CheckGrid(ElementwiseGrid(tokens * heads * (head_dim / 2)), kOp));
  return CudaStatus(
      launch::Rope(Bf16(x), tokens, heads, head_dim, seq, cos_table, sin_table, positions,
                   backward, stream),
      kOp);
}

absl::Status RmsnormForward(const void* x, const void* w, int64_t rows, int dim, float eps, void* y,
                            float* rstd, cudaStream_t stream) {
  constexpr absl::string_view kOp = "RmsnormForward";
  MT_RETURN_IF_ERROR(CheckStream(stream, kOp));
  MT_RETURN_IF_ERROR(CheckNonNegative(rows, "rows", kOp));
  MT_RETURN_IF_ERROR(CheckPositive(dim, "dim", kOp));
  if (!(eps > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": eps = ", eps, " must be > 0"));
  }
  if (rows == 0) return absl::OkStatus();
  MT_RETURN_IF_ERROR(CheckPointer(x, "x", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(w, "w", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(y, "y", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(rstd, "rstd", kOp));
  MT_RETURN_IF_ERROR(CheckGrid(RowGrid(rows), kOp));
  return CudaStatus(launch::RmsnormForward(Bf16(x), Bf16(w), rows, dim, eps, Bf16(y), rstd, stream),
                    kOp);
}

int64_t RmsnormBackwardWorkspaceFloats(int64_t rows, int dim) {
  return rows <= 0 || dim <= 0 ? 0 : DwRowGroups(rows) * dim;
}

absl::Status RmsnormBackward(const void* x, const void* w, const float* rstd, const void* dy,
                             int64_t rows, int dim, bool accumulate_dx, void* dx, float* dw,
                             float* workspace, int64_t workspace_floats, cudaStream_t stream) {
  constexpr absl::string_view kOp = "RmsnormBackward";
  MT_RETURN_IF_ERROR(CheckStream(stream, kOp));
  MT_RETURN_IF_ERROR(CheckNonNegative(rows, "rows", kOp));
  MT_RETURN_IF_ERROR(CheckPositive(dim, "dim", kOp));
  if (rows == 0) return absl::OkStatus();
  const int64_t needed = RmsnormBackwardWorkspaceFloats(rows, dim);
  if (workspace_floats < needed) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": workspace_floats = ", workspace_floats, " < required ", needed));
  }
  MT_RETURN_IF_ERROR(CheckPointer(x, "x", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(w, "w", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(rstd, "rstd", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(dy, "dy", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(dx, "dx", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(dw, "dw", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(workspace, "workspace", kOp));
  MT_RETURN_IF_ERROR(CheckGrid(RowGrid(rows), kOp));
  MT_RETURN_IF_ERROR(CheckGrid(DwPartialGrid(rows, dim), kOp));
  return CudaStatus(launch::RmsnormBackward(Bf16(x), Bf16(w), rstd, Bf16(dy), rows, dim,
                                            accumulate_dx, Bf16(dx), workspace, dw, stream),
                    kOp);
}

absl::Status CrossEntropy(const void* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                          float scale, void* dlogits, float* row_loss, float* loss_sum,
                          cudaStream_t stream) {
  constexpr absl::string_view kOp = "CrossEntropy";
  MT_RETURN_IF_ERROR(CheckStream(stream, kOp));
  MT_RETURN_IF_ERROR(CheckNonNegative(rows, "rows", kOp));
  MT_RETURN_IF_ERROR(CheckPositive(vocab, "vocab", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(loss_sum, "loss_sum", kOp));
  if (rows == 0) {
    return CudaStatus(cudaMemsetAsync(loss_sum, 0, sizeof(float), stream), kOp);
  }
  MT_RETURN_IF_ERROR(CheckPointer(logits, "logits", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(targets, "targets", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(dlogits, "dlogits", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(row_loss, "row_loss", kOp));
  MT_RETURN_IF_ERROR(CheckGrid(RowGrid(rows), kOp));
  return CudaStatus(launch::CrossEntropy(Bf16(logits), targets, rows, vocab, scale, Bf16(dlogits),
                                         row_loss, loss_sum, stream),
                    kOp);
}

absl::Status HeadStatsReset(int64_t rows, float* row_max, float* row_sum, float* target_logit,
                            cudaStream_t stream) {
  constexpr absl::string_view kOp = "HeadStatsReset";
  MT_RETURN_IF_ERROR(CheckStream(stream, kOp));
  MT_RETURN_IF_ERROR(CheckNonNegative(rows, "rows", kOp));
  if (rows == 0) return absl::OkStatus();
  MT_RETURN_IF_ERROR(CheckPointer(row_max, "row_max", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(row_sum, "row_sum", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(target_logit, "target_logit", kOp));
  return CudaStatus(launch::HeadStatsReset(rows, row_max, row_sum, target_logit, stream), kOp);
}

absl::Status HeadBlockStats(const void* logits, const int32_t* targets, int64_t rows,
                            int64_t block_vocab, int64_t first_row, float* row_max,
                            float* row_sum, float* target_logit, cudaStream_t stream) {
  constexpr absl::string_view kOp = "HeadBlockStats";
  MT_RETURN_IF_ERROR(CheckHeadBlock(kOp, stream, rows, block_vocab, first_row,
                                    {{logits, "logits"},
                                     {targets, "targets"},
                                     {row_max, "row_max"},
                                     {row_sum, "row_sum"},
                                     {target_logit, "target_logit"}}));
  if (rows == 0) return absl::OkStatus();
  return CudaStatus(launch::HeadBlockStats(Bf16(logits), targets, rows, block_vocab, first_row,
                                           row_max, row_sum, target_logit, stream),
                    kOp);
}

absl::Status HeadLossFromStats(const float* row_max, const float* row_sum,
                               const float* target_logit, const int32_t* targets, int64_t rows,
                               float* row_loss, float* loss_sum, cudaStream_t stream) {
  constexpr absl::string_view kOp = "HeadLossFromStats";
  MT_RETURN_IF_ERROR(CheckStream(stream, kOp));
  MT_RETURN_IF_ERROR(CheckNonNegative(rows, "rows", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(loss_sum, "loss_sum", kOp));
  if (rows == 0) return CudaStatus(cudaMemsetAsync(loss_sum, 0, sizeof(float), stream), kOp);
  MT_RETURN_IF_ERROR(CheckPointer(row_max, "row_max", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(row_sum, "row_sum", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(target_logit, "target_logit", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(targets, "targets", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(row_loss, "row_loss", kOp));
  return CudaStatus(launch::HeadLossFromStats(row_max, row_sum, target_logit, targets, rows,
                                              row_loss, loss_sum, stream),
                    kOp);
}

absl::Status HeadBlockGrad(const void* logits, const int32_t* targets, int64_t rows,
                           int64_t block_vocab, int64_t first_row, const float* row_max,
                           const float* row_sum, float scale, void* dlogits, cudaStream_t stream) {
  constexpr absl::string_view kOp = "HeadBlockGrad";
  MT_RETURN_IF_ERROR(CheckHeadBlock(kOp, stream, rows, block_vocab, first_row,
                                    {{logits, "logits"},
                                     {targets, "targets"},
                                     {row_max, "row_max"},
                                     {row_sum, "row_sum"},
                                     {dlogits, "dlogits"}}));
  if (rows == 0) return absl::OkStatus();
  return CudaStatus(launch::HeadBlockGrad(Bf16(logits), targets, rows, block_vocab, first_row,
                                          row_max, row_sum, scale, Bf16(dlogits), stream),
                    kOp);
}

namespace {

absl::Status CheckAttentionShape(const AttentionShape& s, absl::string_view op) {
  MT_RETURN_IF_ERROR(CheckPositive(s.batch, "batch", op));
  MT_RETURN_IF_ERROR(CheckPositive(s.seq, "seq", op));
  MT_RETURN_IF_ERROR(CheckPositive(s.q_heads, "q_heads", op));
  MT_RETURN_IF_ERROR(CheckPositive(s.kv_heads, "kv_heads", op));
  if (s.q_heads % s.kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": q_heads = ", s.q_heads, " is not a multiple of kv_heads = ", s.kv_heads));
  }
  if (s.head_dim != 64 && s.head_dim != 128) {
    return absl::UnimplementedError(
        absl::StrCat(op, ": head_dim = ", s.head_dim, " (supported: 64, 128)"));
  }
  if (!(s.softmax_scale > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": softmax_scale = ", s.softmax_scale, " must be > 0"));
  }
  MT_RETURN_IF_ERROR(CheckGrid(AttentionGrid(s.seq, s.batch, s.q_heads), op));
  return absl::OkStatus();
}

launch::AttentionDims ToDims(const AttentionShape& s) {
  return launch::AttentionDims{s.batch,    s.seq,           s.q_heads, s.kv_heads,
                               s.head_dim, s.softmax_scale, s.segments};
}

}  // namespace

absl::Status AttentionForward(const AttentionShape& shape, const void* q, const void* k,
                              const void* v, void* out, float* lse, cudaStream_t stream) {
  constexpr absl::string_view kOp = "AttentionForward";
  MT_RETURN_IF_ERROR(CheckStream(stream, kOp));
  MT_RETURN_IF_ERROR(CheckAttentionShape(shape, kOp));
  MT_RETURN_IF_ERROR(CheckPointer(q, "q", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(k, "k", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(v, "v", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(out, "out", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(lse, "lse", kOp));
  return CudaStatus(
      launch::AttentionForward(ToDims(shape), Bf16(q), Bf16(k), Bf16(v), Bf16(out), lse, stream),
      kOp);
}

size_t AttentionBackwardWorkspaceBytes(const AttentionShape& shape) {
  if (shape.batch <= 0 || shape.seq <= 0 || shape.q_heads <= 0) return 0;
  return sizeof(float) * static_cast<size_t>(shape.batch) * static_cast<size_t>(shape.q_heads) *
         static_cast<size_t>(shape.seq);
}

absl::Status AttentionBackward(const AttentionShape& shape, const void* q, const void* k,
                               const void* v, const void* out, const void* dout, const float* lse,
                               void* dq, void* dk, void* dv, void* workspace,
                               size_t workspace_bytes, cudaStream_t stream) {
  constexpr absl::string_view kOp = "AttentionBackward";
  MT_RETURN_IF_ERROR(CheckStream(stream, kOp));
  MT_RETURN_IF_ERROR(CheckAttentionShape(shape, kOp));
  const size_t needed = AttentionBackwardWorkspaceBytes(shape);
  if (workspace_bytes < needed) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": workspace_bytes = ", workspace_bytes, " < required ", needed));
  }
  MT_RETURN_IF_ERROR(CheckPointer(q, "q", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(k, "k", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(v, "v", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(out, "out", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(dout, "dout", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(lse, "lse", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(dq, "dq", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(dk, "dk", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(dv, "dv", kOp));
  MT_RETURN_IF_ERROR(CheckPointer(workspace, "workspace", kOp));
  return CudaStatus(launch::AttentionBackward(ToDims(shape), Bf16(q), Bf16(k), Bf16(v), Bf16(out),
                                              Bf16(dout), lse, static_cast<float*>(workspace),
                                              Bf16(dq), Bf16(dk), Bf16(dv), stream),
                    kOp);
}

}  // namespace megatrain::kernels::cuda
