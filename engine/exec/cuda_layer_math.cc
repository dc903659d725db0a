// CUDA implementation of the decoder layer, the embedding and the head,
// written over kernels/cuda in the same order as cpu_layer_math.cc.
//
// Biases have no kernel of their own: y = x W^T + b is two GEMMs into one
// output, first ones[N, 1] * b[1, out] (each element exactly b, k = 1), then
// x W^T added onto it with beta = 1, so y is rounded to bf16 once; the bias
// gradient is dy^T * ones[N, 1], an ordinary weight-gradient GEMM with one
// input column (deterministic like every other). Residual adds ride on the
// same beta = 1 path: x_mid = x_in + attn W_o^T is rounded once, not twice.
#include "engine/exec/cuda_layer_math.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/bf16.h"
#include "kernels/cuda/cuda_status.h"
#include "engine/common/status_macros.h"
#include "kernels/cuda/ops.h"

namespace megatrain::engine {
namespace {

namespace kc = kernels::cuda;
using bf16 = __nv_bfloat16;

// Prefixes a failed status with where in the layer it happened.
absl::Status InStep(absl::Status status, const char* step) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(step, ": ", std::string(status.message())));
}

float* At(float* base, int64_t offset) { return offset < 0 ? nullptr : base + offset; }

absl::Status CheckStream(cudaStream_t stream, const char* op) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": stream is a default stream; pass a created stream"));
  }
  return absl::OkStatus();
}

absl::Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes, cudaStream_t stream,
                                const char* what) {
  return kc::CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream), what);
}

absl::Status CheckPositive(int64_t value, const char* field) {
  if (value <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("dims.", field, " = ", value, " must be > 0"));
  }
  return absl::OkStatus();
}

// Kernels take int sizes and int32 token indices.
absl::Status CheckFitsInt(int64_t value, const char* field) {
  if (value > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " = ", value, " exceeds ", INT_MAX, " (CUDA kernels index with int)"));
  }
  return absl::OkStatus();
}

// The current device's compute capability major; 0 when it cannot be read.
int DeviceComputeMajor() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    return 0;
  }
  return major;
}

absl::Status CheckOffset(int64_t offset, const char* field) {
  if (offset < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("offsets.", field, " = ", offset, ": the tensor is mandatory"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CudaLayerMath::Validate(const ModelDims& m, const LayerOffsets& o,
                                     const kernels::cpu::RopeTable& rope) {
  MT_RETURN_IF_ERROR(CheckPositive(m.vocab, "vocab"));
  MT_RETURN_IF_ERROR(CheckPositive(m.hidden, "hidden"));
  MT_RETURN_IF_ERROR(CheckPositive(m.ffn, "ffn"));
  MT_RETURN_IF_ERROR(CheckPositive(m.q_heads, "q_heads"));
  MT_RETURN_IF_ERROR(CheckPositive(m.kv_heads, "kv_heads"));
  MT_RETURN_IF_ERROR(CheckPositive(m.head_dim, "head_dim"));
  MT_RETURN_IF_ERROR(CheckPositive(m.batch, "batch"));
  MT_RETURN_IF_ERROR(CheckPositive(m.seq, "seq"));
  MT_RETURN_IF_ERROR(CheckPositive(m.head_chunk, "head_chunk"));
  if (!(m.rms_eps > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("dims.rms_eps = ", m.rms_eps, " must be > 0"));
  }
  if (m.head_dim != 64 && m.head_dim != 128) {
    return absl::UnimplementedError(absl::StrCat(
        "dims.head_dim = ", m.head_dim, ": the CUDA attention kernels support 64 and 128"));
  }
  if (m.q_heads % m.kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dims.q_heads = ", m.q_heads, " is not a multiple of dims.kv_heads = ", m.kv_heads));
  }
  if (m.sliding_window < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dims.sliding_window = ", m.sliding_window, " must be >= 0"));
  }
  if (m.sliding_window > 0 && m.seq > m.sliding_window) {
    return absl::UnimplementedError(absl::StrCat("dims.sliding_window = ", m.sliding_window,
                                                 " is shorter than dims.seq = ", m.seq,
                                                 ": the CUDA attention is plain causal"));
  }
  MT_RETURN_IF_ERROR(CheckFitsInt(m.hidden, "dims.hidden"));
  MT_RETURN_IF_ERROR(CheckFitsInt(m.ffn, "dims.ffn"));
  MT_RETURN_IF_ERROR(CheckFitsInt(m.q_heads, "dims.q_heads"));
  MT_RETURN_IF_ERROR(CheckFitsInt(m.batch, "dims.batch"));
  MT_RETURN_IF_ERROR(CheckFitsInt(m.seq, "dims.seq"));
  MT_RETURN_IF_ERROR(CheckFitsInt(m.tokens(), "dims.batch * dims.seq"));
  MT_RETURN_IF_ERROR(CheckFitsInt(m.batch * m.q_heads * m.seq, "dims.batch * q_heads * seq"));

  MT_RETURN_IF_ERROR(CheckOffset(o.input_norm, "input_norm"));
  MT_RETURN_IF_ERROR(CheckOffset(o.q, "q"));
  MT_RETURN_IF_ERROR(CheckOffset(o.k, "k"));
  MT_RETURN_IF_ERROR(CheckOffset(o.v, "v"));
  MT_RETURN_IF_ERROR(CheckOffset(o.o, "o"));
  MT_RETURN_IF_ERROR(CheckOffset(o.post_norm, "post_norm"));
  MT_RETURN_IF_ERROR(CheckOffset(o.gate, "gate"));
  MT_RETURN_IF_ERROR(CheckOffset(o.up, "up"));
  MT_RETURN_IF_ERROR(CheckOffset(o.down, "down"));
  // qwen3's per-head norms come as a pair, and the activation sets hold the
  // projections they read only when dims.qk_norm says so.
  if ((o.q_norm >= 0) != m.qk_norm || (o.k_norm >= 0) != m.qk_norm) {
    return absl::InvalidArgumentError(absl::StrCat(
        "offsets.q_norm = ", o.q_norm, ", offsets.k_norm = ", o.k_norm,
        " disagree with dims.qk_norm = ", m.qk_norm ? "true" : "false"));
  }

  if (rope.head_dim() != m.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat("rope table head_dim = ", rope.head_dim(),
                                                   " differs from dims.head_dim = ", m.head_dim));
  }
  if (rope.max_positions() < m.seq) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope table max_positions = ", rope.max_positions(), " < dims.seq = ", m.seq));
  }
  return absl::OkStatus();
}

absl::StatusOr<CudaLayerMath> CudaLayerMath::Create(const ModelDims& dims,
                                                    const LayerOffsets& offsets,
                                                    const kernels::cpu::RopeTable& rope,
                                                    void* device_tables_base,
                                                    cudaStream_t setup_stream,
                                                    const CudaLayerMathOptions& options) {
  MT_RETURN_IF_ERROR(Validate(dims, offsets, rope));
  if (device_tables_base == nullptr) {
    return absl::InvalidArgumentError("device_tables_base is null");
  }
  if (reinterpret_cast<uintptr_t>(device_tables_base) % kCudaCarveAlignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device_tables_base is not ", kCudaCarveAlignment, "-byte aligned"));
  }
  MT_RETURN_IF_ERROR(CheckStream(setup_stream, "CudaLayerMath::Create"));

  absl::StatusOr<kc::CublasLtGemm> gemm = kc::CublasLtGemm::Create();
  if (!gemm.ok()) return InStep(gemm.status(), "CudaLayerMath::Create");

  const CudaLayerTables tables = CudaLayerTables::Carve(dims, device_tables_base);
  // RopeTable rows are contiguous [max_positions, head_dim / 2]: rows 0..seq-1
  // are its first seq * half values, the layout RopeInPlace reads.
  const size_t table_bytes = sizeof(float) * static_cast<size_t>(dims.seq * (dims.head_dim / 2));
  const std::vector<uint16_t> ones(static_cast<size_t>(dims.tokens()),
                                   kernels::Float32ToBf16Bits(1.0f));
  MT_RETURN_IF_ERROR(kc::CudaStatus(cudaMemcpyAsync(tables.rope_cos, rope.cos_row(0), table_bytes,
                                                    cudaMemcpyHostToDevice, setup_stream),
                                    "upload RoPE cos table"));
  MT_RETURN_IF_ERROR(kc::CudaStatus(cudaMemcpyAsync(tables.rope_sin, rope.sin_row(0), table_bytes,
                                                    cudaMemcpyHostToDevice, setup_stream),
                                    "upload RoPE sin table"));
  MT_RETURN_IF_ERROR(
      kc::CudaStatus(cudaMemcpyAsync(tables.ones, ones.data(), sizeof(uint16_t) * ones.size(),
                                     cudaMemcpyHostToDevice, setup_stream),
                     "upload ones vector"));
  // The host sources die with this call.
  MT_RETURN_IF_ERROR(
      kc::CudaStatus(cudaStreamSynchronize(setup_stream), "CudaLayerMath::Create tables"));
  CudaLayerMath math(dims, offsets, tables, std::move(*gemm));

  math.positions_ = options.positions;
  math.segments_ = options.segments;
  // Attention: decided once, for the forward and the backward alike.
  const kc::AttentionShape shape = math.AttentionShapeOf();
  kc::AttentionSelectInputs select;
  select.cudnn_enabled = options.cudnn_attention && kc::CudnnAttentionAllowedByEnv();
  select.cudnn_built = kc::CudnnAttentionBuilt();
  select.sm_major = DeviceComputeMajor();
  select.cudnn_version = select.cudnn_built ? kc::CudnnRuntimeVersion() : 0;
  kc::AttentionChoice choice = kc::SelectAttentionImpl(shape, select);
  if (choice.impl == kc::AttentionImpl::kCudnn) {
    const size_t forward_reserved = tables.attention_forward_workspace_bytes;
    const size_t backward_reserved = CudaAttentionWorkspaceBytes(dims);
    absl::StatusOr<kc::CudnnAttention> cudnn = kc::CudnnAttention::Create();
    absl::StatusOr<kc::CudnnAttentionWorkspace> workspace =
        cudnn.ok() ? cudnn->Prepare(
                         shape, kc::SplitCudnnAttentionBackward(shape, select.workspace_cap_bytes))
                   : absl::StatusOr<kc::CudnnAttentionWorkspace>(cudnn.status());
    if (!workspace.ok()) {
      choice = kc::AttentionChoice{kc::AttentionImpl::kOwnKernel,
                                   absl::StrCat("cuDNN refused: ", workspace.status().ToString())};
    } else if (workspace->forward > forward_reserved || workspace->backward > backward_reserved) {
      choice = kc::AttentionChoice{
          kc::AttentionImpl::kOwnKernel,
          absl::StrCat("cuDNN plans need ", workspace->forward, " / ", workspace->backward,
                       " workspace bytes (forward / backward); the memory plan reserved ",
                       forward_reserved, " / ", backward_reserved)};
    } else {
      math.cudnn_ = std::make_unique<kc::CudnnAttention>(std::move(*cudnn));
      choice.reason = absl::StrCat(choice.reason, " (workspace ", workspace->forward, " / ",
                                   workspace->backward, " bytes)");
    }
  }
  math.attention_impl_ = choice.impl;
  math.attention_reason_ = choice.reason;
  std::fprintf(stderr, "megatrain: attention: %s: %s\n", kc::AttentionImplName(choice.impl),
               choice.reason.c_str());
  return math;
}

kc::AttentionShape CudaLayerMath::AttentionShapeOf() const {
  kc::AttentionShape shape = CudaAttentionShape(dims_);
  shape.segments = segments_;
  return shape;
}

absl::Status CudaLayerMath::AttentionForward(const CudaActivations& a, bf16* out, float* lse,
                                             cudaStream_t stream) const {
  const kc::AttentionShape shape = AttentionShapeOf();
  if (attention_impl_ == kc::AttentionImpl::kCudnn) {
    return cudnn_->Forward(shape, a.q, a.k, a.v, out, lse, tables_.attention_forward_workspace,
                           tables_.attention_forward_workspace_bytes, stream);
  }
  return kc::AttentionForward(shape, a.q, a.k, a.v, out, lse, stream);
}

absl::Status CudaLayerMath::AttentionBackward(const CudaActivations& a, CudaBackwardScratch& s,
                                              cudaStream_t stream) const {
  const kc::AttentionShape shape = AttentionShapeOf();
  if (attention_impl_ == kc::AttentionImpl::kCudnn) {
    return cudnn_->Backward(shape, a.q, a.k, a.v, a.attn, s.d_attn, a.lse, s.d_q, s.d_k, s.d_v,
                            s.attention_workspace, s.attention_workspace_bytes, stream);
  }
  return kc::AttentionBackward(shape, a.q, a.k, a.v, a.attn, s.d_attn, a.lse, s.d_q, s.d_k,
                               s.d_v, s.attention_workspace, s.attention_workspace_bytes, stream);
}

absl::Status CudaLayerMath::Linear(const bf16* x, const bf16* w, const bf16* bias, int64_t in,
                                   int64_t out, bf16* y, cudaStream_t stream) const {
  return BiasAndProduct(x, w, bias, in, out, /*accumulate=*/false, /*source=*/nullptr, y, stream);
}

absl::Status CudaLayerMath::LinearAddTo(const bf16* x, const bf16* w, const bf16* bias, int64_t in,
                                        int64_t out, const bf16* residual, bf16* y,
                                        cudaStream_t stream) const {
  return BiasAndProduct(x, w, bias, in, out, /*accumulate=*/true, residual, y, stream);
}

// y = (source, when accumulate) + ones[n, 1] * bias[1, out] + x W^T: the first
// GEMM reads the source as C (C != D), each later one adds onto y (beta = 1), so
// y is rounded to bf16 once per GEMM, as when the source was first copied into y.
absl::Status CudaLayerMath::BiasAndProduct(const bf16* x, const bf16* w, const bf16* bias,
                                           int64_t in, int64_t out, bool accumulate,
                                           const bf16* source, bf16* y, cudaStream_t stream) const {
  const int64_t n = dims_.tokens();
  if (bias != nullptr) {
    kc::MatmulArgs broadcast;
    broadcast.m = n;
    broadcast.n = out;
    broadcast.k = 1;
    broadcast.a = tables_.ones;
    broadcast.b = bias;
    broadcast.c = y;
    broadcast.c_source = source;
    broadcast.beta = accumulate ? 1.0f : 0.0f;
    MT_RETURN_IF_ERROR(gemm_.Matmul(broadcast, stream));
    accumulate = true;
    source = nullptr;  // y holds it now
  }
  kc::MatmulArgs product;
  product.m = n;
  product.n = out;
  product.k = in;
  product.a = x;
  product.b = w;
  product.transpose_b = true;
  product.c = y;
  product.c_source = source;
  product.beta = accumulate ? 1.0f : 0.0f;
  return gemm_.Matmul(product, stream);
}

absl::Status CudaLayerMath::LinearBackward(const bf16* dy, const bf16* x, const bf16* w, int64_t in,
                                           int64_t out, bf16* dx, bool accumulate, float* dw,
                                           float* db, cudaStream_t stream) const {
  const int64_t n = dims_.tokens();
  MT_RETURN_IF_ERROR(gemm_.LinearBackwardInput(dy, w, dx, n, in, out, accumulate, stream));
  MT_RETURN_IF_ERROR(gemm_.LinearBackwardWeight(dy, x, dw, n, in, out, stream));
  if (db == nullptr) return absl::OkStatus();
  // db[out, 1] += dy^T[out, n] * ones[n, 1]
  return gemm_.LinearBackwardWeight(dy, tables_.ones, db, n, /*in=*/1, out, stream);
}

absl::Status CudaLayerMath::ProjectHeads(const bf16* x, const bf16* w, const bf16* bias,
                                         const bf16* head_norm, int64_t heads, bf16* proj,
                                         float* rstd, bf16* out, cudaStream_t stream) const {
  const int64_t width = heads * dims_.head_dim;
  if (head_norm == nullptr) return Linear(x, w, bias, dims_.hidden, width, out, stream);
  MT_RETURN_IF_ERROR(Linear(x, w, bias, dims_.hidden, width, proj, stream));
  return InStep(kc::RmsnormForward(proj, head_norm, dims_.tokens() * heads,
                                   static_cast<int>(dims_.head_dim), dims_.rms_eps, out, rstd,
                                   stream),
                "per-head norm");
}

absl::Status CudaLayerMath::ProjectHeadsBackward(const bf16* d_out, const bf16* x, const bf16* w,
                                                 const bf16* head_norm, const bf16* proj,
                                                 const float* rstd, int64_t heads,
                                                 CudaBackwardScratch& s, bool accumulate,
                                                 float* dw, float* db, float* head_norm_grad,
                                                 cudaStream_t stream) const {
  const int64_t width = heads * dims_.head_dim;
  const bf16* dy = d_out;
  if (head_norm != nullptr) {
    MT_RETURN_IF_ERROR(InStep(
        kc::RmsnormBackward(proj, head_norm, rstd, d_out, dims_.tokens() * heads,
                            static_cast<int>(dims_.head_dim), /*accumulate_dx=*/false, s.d_attn,
                            head_norm_grad, s.norm_workspace, s.norm_workspace_floats, stream),
        "per-head norm backward"));
    dy = s.d_attn;
  }
  return LinearBackward(dy, x, w, dims_.hidden, width, s.d_h, accumulate, dw, db, stream);
}

absl::Status CudaLayerMath::EmbedForward(const int32_t* ids, const bf16* table, bf16* x_out,
                                         cudaStream_t stream) const {
  return kc::EmbeddingForward(ids, dims_.tokens(), table, dims_.vocab,
                              static_cast<int>(dims_.hidden), x_out, stream);
}

absl::Status CudaLayerMath::EmbedBackward(const CudaEmbeddingGradIndex& index, const bf16* dx,
                                          float* dtable, cudaStream_t stream) const {
  return kc::EmbeddingBackward(index.unique_rows, index.segment_offsets, index.token_order,
                               index.unique_count, dims_.tokens(), dx,
                               static_cast<int>(dims_.hidden), dtable, stream);
}

absl::Status CudaLayerMath::LayerForward(const bf16* w, const bf16* x_in, CudaActivations& a,
                                         bf16* x_out, cudaStream_t stream) const {
  const Weights weights = LayerWeightsAt(w, offsets_);
  for (int part = 0; part < kLayerParts; ++part) {
    MT_RETURN_IF_ERROR(LayerForwardPart(part, weights, x_in, a, x_out, stream));
  }
  return absl::OkStatus();
}

absl::Status CudaLayerMath::LayerForwardPart(int part, const Weights& w, const bf16* x_in,
                                             CudaActivations& a, bf16* x_out,
                                             cudaStream_t stream) const {
  MT_RETURN_IF_ERROR(CheckStream(stream, "LayerForward"));
  const ModelDims& m = dims_;
  const int64_t n = m.tokens();
  const int d = static_cast<int>(m.hidden);
  const int seq = static_cast<int>(m.seq);
  const int head_dim = static_cast<int>(m.head_dim);
  switch (part) {
    case 0:  // input_norm
      MT_RETURN_IF_ERROR(CopyDeviceToDevice(a.x_in, x_in, sizeof(bf16) * static_cast<size_t>(n * d),
                                            stream, "LayerForward: save x_in"));
      return InStep(
          kc::RmsnormForward(a.x_in, w.input_norm, n, d, m.rms_eps, a.h1, a.rstd1, stream),
          "LayerForward input norm");
    case 1:
      return InStep(ProjectHeads(a.h1, w.q, w.q_bias, w.q_norm, m.q_heads, a.q_proj, a.rstd_q,
                                 a.q, stream),
                    "LayerForward q_proj");
    case 2:
      return InStep(ProjectHeads(a.h1, w.k, w.k_bias, w.k_norm, m.kv_heads, a.k_proj, a.rstd_k,
                                 a.k, stream),
                    "LayerForward k_proj");
    case 3:
      MT_RETURN_IF_ERROR(
          InStep(Linear(a.h1, w.v, w.v_bias, d, m.kv_width(), a.v, stream), "LayerForward v_proj"));
      MT_RETURN_IF_ERROR(InStep(kc::RopeInPlace(a.q, n, static_cast<int>(m.q_heads), head_dim, seq,
                                                tables_.rope_cos, tables_.rope_sin,
                                                /*backward=*/false, stream, positions_),
                                "LayerForward RoPE q"));
      MT_RETURN_IF_ERROR(InStep(kc::RopeInPlace(a.k, n, static_cast<int>(m.kv_heads), head_dim, seq,
                                                tables_.rope_cos, tables_.rope_sin,
                                                /*backward=*/false, stream, positions_),
                                "LayerForward RoPE k"));
      return InStep(AttentionForward(a, a.attn, a.lse, stream), "LayerForward attention");
    case 4:  // x_mid = x_in + attn W_o^T (+ b_o)
      return InStep(LinearAddTo(a.attn, w.o, w.o_bias, m.q_width(), d, a.x_in, a.x_mid, stream),
                    "LayerForward o_proj");
    case 5:
      return InStep(
          kc::RmsnormForward(a.x_mid, w.post_norm, n, d, m.rms_eps, a.h2, a.rstd2, stream),
          "LayerForward post-attention norm");
    case 6:
      return InStep(Linear(a.h2, w.gate, w.gate_bias, d, m.ffn, a.gate, stream),
                    "LayerForward gate_proj");
    case 7:
      MT_RETURN_IF_ERROR(
          InStep(Linear(a.h2, w.up, w.up_bias, d, m.ffn, a.up, stream), "LayerForward up_proj"));
      return InStep(kc::SwigluForward(a.gate, a.up, a.act, n * m.ffn, stream),
                    "LayerForward SwiGLU");
    case 8:  // x_out = x_mid + act W_down^T (+ b_down)
      return InStep(LinearAddTo(a.act, w.down, w.down_bias, m.ffn, d, a.x_mid, x_out, stream),
                    "LayerForward down_proj");
  }
  return absl::InvalidArgumentError(absl::StrCat("LayerForward part ", part, " of ", kLayerParts));
}

absl::Status CudaLayerMath::LayerBackward(const bf16* w, const CudaActivations& a,
                                          CudaBackwardScratch& s, const bf16* dx_out, bf16* dx_in,
                                          float* g, cudaStream_t stream) const {
  const Weights weights = LayerWeightsAt(w, offsets_);
  for (int part = 0; part < kLayerParts; ++part) {
    MT_RETURN_IF_ERROR(LayerBackwardPart(part, weights, a, s, dx_out, dx_in, g, stream));
  }
  return absl::OkStatus();
}

absl::Status CudaLayerMath::LayerBackwardPart(int part, const Weights& w, const CudaActivations& a,
                                              CudaBackwardScratch& s, const bf16* dx_out,
                                              bf16* dx_in, float* g, cudaStream_t stream) const {
  MT_RETURN_IF_ERROR(CheckStream(stream, "LayerBackward"));
  const ModelDims& m = dims_;
  const LayerOffsets& o = offsets_;
  const int64_t n = m.tokens();
  const int d = static_cast<int>(m.hidden);
  const int seq = static_cast<int>(m.seq);
  const int head_dim = static_cast<int>(m.head_dim);
  bf16* d_mid = dx_in;  // dx_in doubles as d x_mid until the attention half adds to it
  switch (part) {
    // MLP: x_out = x_mid + down(swiglu(gate(h2), up(h2))).
    case 0:
      MT_RETURN_IF_ERROR(
          InStep(LinearBackward(dx_out, a.act, w.down, m.ffn, d, s.d_act,
                                /*accumulate=*/false, g + o.down, At(g, o.down_bias), stream),
                 "LayerBackward down_proj"));
      return InStep(kc::SwigluBackward(a.gate, a.up, s.d_act, s.d_gate, s.d_up, n * m.ffn, stream),
                    "LayerBackward SwiGLU");
    case 1:
      return InStep(LinearBackward(s.d_gate, a.h2, w.gate, d, m.ffn, s.d_h,
                                   /*accumulate=*/false, g + o.gate, At(g, o.gate_bias), stream),
                    "LayerBackward gate_proj");
    case 2:
      return InStep(LinearBackward(s.d_up, a.h2, w.up, d, m.ffn, s.d_h,
                                   /*accumulate=*/true, g + o.up, At(g, o.up_bias), stream),
                    "LayerBackward up_proj");
    case 3:  // d x_mid = dx_out (residual) + norm backward of d h2.
      MT_RETURN_IF_ERROR(CopyDeviceToDevice(d_mid, dx_out,
                                            sizeof(bf16) * static_cast<size_t>(n * d), stream,
                                            "LayerBackward: residual gradient"));
      return InStep(kc::RmsnormBackward(a.x_mid, w.post_norm, a.rstd2, s.d_h, n, d,
                                        /*accumulate_dx=*/true, d_mid, g + o.post_norm,
                                        s.norm_workspace, s.norm_workspace_floats, stream),
                    "LayerBackward post-attention norm");
    // Attention: x_mid = x_in + o(attn(rope(q(h1)), rope(k(h1)), v(h1))).
    case 4:
      MT_RETURN_IF_ERROR(
          InStep(LinearBackward(d_mid, a.attn, w.o, m.q_width(), d, s.d_attn,
                                /*accumulate=*/false, g + o.o, At(g, o.o_bias), stream),
                 "LayerBackward o_proj"));
      MT_RETURN_IF_ERROR(InStep(AttentionBackward(a, s, stream), "LayerBackward attention"));
      MT_RETURN_IF_ERROR(InStep(kc::RopeInPlace(s.d_q, n, static_cast<int>(m.q_heads), head_dim,
                                                seq, tables_.rope_cos, tables_.rope_sin,
                                                /*backward=*/true, stream, positions_),
                                "LayerBackward RoPE q"));
      return InStep(kc::RopeInPlace(s.d_k, n, static_cast<int>(m.kv_heads), head_dim, seq,
                                    tables_.rope_cos, tables_.rope_sin,
                                    /*backward=*/true, stream, positions_),
                    "LayerBackward RoPE k");
    // d_attn is free once attention's backward ran: it holds qwen3's
    // gradient at the q, then the k projection.
    case 5:
      return InStep(ProjectHeadsBackward(s.d_q, a.h1, w.q, w.q_norm, a.q_proj, a.rstd_q,
                                         m.q_heads, s, /*accumulate=*/false, g + o.q,
                                         At(g, o.q_bias), At(g, o.q_norm), stream),
                    "LayerBackward q_proj");
    case 6:
      return InStep(ProjectHeadsBackward(s.d_k, a.h1, w.k, w.k_norm, a.k_proj, a.rstd_k,
                                         m.kv_heads, s, /*accumulate=*/true, g + o.k,
                                         At(g, o.k_bias), At(g, o.k_norm), stream),
                    "LayerBackward k_proj");
    case 7:
      return InStep(LinearBackward(s.d_v, a.h1, w.v, d, m.kv_width(), s.d_h,
                                   /*accumulate=*/true, g + o.v, At(g, o.v_bias), stream),
                    "LayerBackward v_proj");
    case 8:  // dx_in = d x_mid (residual, already in place) + norm backward of d h1.
      return InStep(kc::RmsnormBackward(a.x_in, w.input_norm, a.rstd1, s.d_h, n, d,
                                        /*accumulate_dx=*/true, dx_in, g + o.input_norm,
                                        s.norm_workspace, s.norm_workspace_floats, stream),
                    "LayerBackward input norm");
  }
  return absl::InvalidArgumentError(absl::StrCat("LayerBackward part ", part, " of ", kLayerParts));
}

absl::Status CudaLayerMath::HeadForwardBlock(const HeadBlock& block, const HeadPointers& p,
                                             CudaHeadScratch& s, cudaStream_t stream) const {
  const ModelDims& m = dims_;
  const int64_t n = m.tokens();
  const int d = static_cast<int>(m.hidden);
  for (int64_t first = 0; first < n; first += m.head_chunk) {
    const int64_t rows = std::min(m.head_chunk, n - first);
    const bf16* h_chunk = s.h + first * d;
    if (p.form == HeadForm::kLogits) {
      // [sub, block] = h W_block^T in fp32, a few rows at a time into the staging.
      const int64_t staging_rows = CudaHeadLogitsRows(m);
      for (int64_t sub = 0; sub < rows; sub += staging_rows) {
        const int64_t sub_rows = std::min(staging_rows, rows - sub);
        kc::MatmulArgs args;
        args.m = sub_rows;
        args.n = block.rows;
        args.k = d;
        args.a = h_chunk + sub * d;
        args.b = p.lm_block;
        args.transpose_b = true;
        args.c = s.logits_f32;
        args.c_type = kc::GemmOutput::kFp32;
        MT_RETURN_IF_ERROR(InStep(gemm_.Matmul(args, stream), "Head logits block"));
        MT_RETURN_IF_ERROR(InStep(
            kernels::cuda::CudaStatus(
                cudaMemcpy2DAsync(p.logits + (first + sub) * m.vocab + block.first_row,
                                  m.vocab * sizeof(float), s.logits_f32,
                                  block.rows * sizeof(float), block.rows * sizeof(float),
                                  sub_rows, cudaMemcpyDeviceToDevice, stream),
                "copy the logits block"),
            "Head logits block"));
      }
      continue;
    }
    MT_RETURN_IF_ERROR(InStep(
        gemm_.LinearForward(h_chunk, p.lm_block, s.logits, rows, d, block.rows, stream),
        "Head logits"));
    MT_RETURN_IF_ERROR(InStep(
        kc::HeadBlockStats(s.logits, p.targets + first, rows, block.rows, block.first_row,
                           s.row_max + first, s.row_sum + first, s.target_logit + first, stream),
        "Head block log-sum-exp"));
  }
  return absl::OkStatus();
}

absl::Status CudaLayerMath::HeadBackwardBlock(const HeadBlock& block, bool first_block,
                                              const HeadPointers& p, CudaHeadScratch& s,
                                              cudaStream_t stream) const {
  const ModelDims& m = dims_;
  const int64_t n = m.tokens();
  const int d = static_cast<int>(m.hidden);
  MT_RETURN_IF_ERROR(InStep(
      kernels::cuda::CudaStatus(
          cudaMemsetAsync(p.lm_block_grad, 0, block.rows * d * sizeof(float), stream),
          "zero the block gradient"),
      "Head block backward"));
  for (int64_t first = 0; first < n; first += m.head_chunk) {
    const int64_t rows = std::min(m.head_chunk, n - first);
    const bf16* h_chunk = s.h + first * d;
    MT_RETURN_IF_ERROR(InStep(
        gemm_.LinearForward(h_chunk, p.lm_block, s.logits, rows, d, block.rows, stream),
        "Head logits again"));
    // d logits overwrite the logits in place (the kernel allows the alias).
    MT_RETURN_IF_ERROR(InStep(
        kc::HeadBlockGrad(s.logits, p.targets + first, rows, block.rows, block.first_row,
                          s.row_max + first, s.row_sum + first, p.inv_total_valid, s.logits,
                          stream),
        "Head block d logits"));
    kc::MatmulArgs dh;  // d_h[chunk] (= or +=) dlogits W_block, fp32
    dh.m = rows;
    dh.n = d;
    dh.k = block.rows;
    dh.a = s.logits;
    dh.b = p.lm_block;
    dh.c = s.d_h + first * d;
    dh.c_type = kc::GemmOutput::kFp32;
    dh.beta = first_block ? 0.0f : 1.0f;
    MT_RETURN_IF_ERROR(InStep(gemm_.Matmul(dh, stream), "Head d hidden"));
    MT_RETURN_IF_ERROR(InStep(gemm_.LinearBackwardWeight(s.logits, h_chunk, p.lm_block_grad, rows,
                                                         d, block.rows, stream),
                              "Head d lm_head block"));
  }
  return absl::OkStatus();
}

absl::Status CudaLayerMath::HeadStep(engine::HeadStep step, const HeadPointers& p,
                                     CudaHeadScratch& s, cudaStream_t stream) const {
  MT_RETURN_IF_ERROR(CheckStream(stream, "HeadStep"));
  const ModelDims& m = dims_;
  const int64_t n = m.tokens();
  const int d = static_cast<int>(m.hidden);
  switch (step.kind) {
    case HeadStepKind::kNorm:
      MT_RETURN_IF_ERROR(InStep(
          kc::RmsnormForward(p.x_final, p.final_norm, n, d, m.rms_eps, s.h, s.rstd, stream),
          "Head final norm"));
      return InStep(kc::HeadStatsReset(n, s.row_max, s.row_sum, s.target_logit, stream),
                    "Head log-sum-exp reset");
    case HeadStepKind::kForwardBlock: {
      MT_RETURN_IF_ERROR(HeadForwardBlock(HeadBlockAt(m, step.block), p, s, stream));
      if (p.form == HeadForm::kLogits || step.block + 1 < HeadBlockCount(m)) {
        return absl::OkStatus();
      }
      for (int64_t c = 0, first = 0; first < n; ++c, first += m.head_chunk) {
        const int64_t rows = std::min(m.head_chunk, n - first);
        MT_RETURN_IF_ERROR(InStep(
            kc::HeadLossFromStats(s.row_max + first, s.row_sum + first, s.target_logit + first,
                                  p.targets + first, rows, s.row_loss, p.chunk_loss_sums + c,
                                  stream),
            "Head loss"));
      }
      return absl::OkStatus();
    }
    case HeadStepKind::kBackwardBlock:
      if (p.lm_block_grad == nullptr) {
        return absl::InvalidArgumentError("HeadStep: a backward block needs lm_block_grad");
      }
      return HeadBackwardBlock(HeadBlockAt(m, step.block), step.block == 0, p, s, stream);
    case HeadStepKind::kNormBackward:
      if (p.dx_final == nullptr || p.final_norm_grad == nullptr) {
        return absl::InvalidArgumentError(
            "HeadStep: the final norm's backward needs dx_final and final_norm_grad");
      }
      // h is dead once every block's backward ran: it takes the rounded d_h.
      MT_RETURN_IF_ERROR(InStep(kc::RoundToBf16(s.d_h, s.h, n * d, stream), "Head d_h to bf16"));
      MT_RETURN_IF_ERROR(InStep(
          kernels::cuda::CudaStatus(
              cudaMemsetAsync(p.final_norm_grad, 0, d * sizeof(float), stream),
              "zero the final norm gradient"),
          "Head final norm backward"));
      return InStep(kc::RmsnormBackward(p.x_final, p.final_norm, s.rstd, s.h, n, d,
                                        /*accumulate_dx=*/false, p.dx_final, p.final_norm_grad,
                                        s.norm_workspace, s.norm_workspace_floats, stream),
                    "Head final norm backward");
  }
  return absl::OkStatus();
}

absl::Status CudaLayerMath::Head(HeadPointers p, const bf16* lm_head, float* lm_head_grad,
                                 CudaHeadScratch& s, cudaStream_t stream) const {
  const ModelDims& m = dims_;
  const int parts = HeadPartCount(m, p.form == HeadForm::kTrain);
  for (int part = 0; part < parts; ++part) {
    const engine::HeadStep step = HeadStepAt(m, part);
    const int64_t first = HeadBlockAt(m, step.block).first_row * m.hidden;
    p.lm_block = lm_head + first;
    p.lm_block_grad = lm_head_grad == nullptr ? nullptr : lm_head_grad + first;
    MT_RETURN_IF_ERROR(HeadStep(step, p, s, stream));
  }
  return absl::OkStatus();
}

double CudaLayerMath::SumChunkLosses(std::span<const float> chunk_loss_sums) {
  double total = 0.0;
  for (const float v : chunk_loss_sums) total += static_cast<double>(v);
  return total;
}

}  // namespace megatrain::engine
