// cuDNN fused SDPA through cudnn-frontend's graph API (cudnn_attention.h).
#include "kernels/cuda/cudnn_attention.h"

#include <cudnn.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <map>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"

#if defined(MEGATRAIN_HAVE_CUDNN_FRONTEND)
#include <cudnn_frontend.h>
#endif

namespace megatrain::kernels::cuda {
namespace {

// A cuDNN status as absl::Status: no device / not initialised -> UNAVAILABLE
// style FailedPrecondition; unsupported -> Unimplemented; bad parameter ->
// InvalidArgument; memory -> ResourceExhausted; the rest Internal.
absl::Status CudnnStatus(cudnnStatus_t status, absl::string_view context) {
  if (status == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
  const std::string message =
      absl::StrCat(context, ": ", cudnnGetErrorString(status), " (", static_cast<int>(status), ")");
  switch (status) {
    case CUDNN_STATUS_NOT_INITIALIZED:
      return absl::FailedPreconditionError(message);
    case CUDNN_STATUS_NOT_SUPPORTED:
      return absl::UnimplementedError(message);
    case CUDNN_STATUS_BAD_PARAM:
      return absl::InvalidArgumentError(message);
    case CUDNN_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

// [[maybe_unused]]: only the cudnn-frontend build (MEGATRAIN_HAVE_CUDNN_FRONTEND) calls it.
[[maybe_unused]] absl::Status CheckStream(cudaStream_t stream, absl::string_view op) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": stream is a default stream; pass a created stream"));
  }
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------- CudnnHandle

absl::StatusOr<CudnnHandle> CudnnHandle::Create() {
  cudnnHandle_t handle = nullptr;
  MT_RETURN_IF_ERROR(CudnnStatus(cudnnCreate(&handle), "cudnnCreate"));
  return CudnnHandle(handle);
}

CudnnHandle::~CudnnHandle() {
  if (handle_ != nullptr) cudnnDestroy(handle_);
}

CudnnHandle::CudnnHandle(CudnnHandle&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)),
      bound_(std::exchange(other.bound_, nullptr)) {}

CudnnHandle& CudnnHandle::operator=(CudnnHandle&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) cudnnDestroy(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
    bound_ = std::exchange(other.bound_, nullptr);
  }
  return *this;
}

absl::Status CudnnHandle::BindStream(cudaStream_t stream) {
  if (handle_ == nullptr) return absl::FailedPreconditionError("CudnnHandle: no handle");
  if (stream == bound_) return absl::OkStatus();
  MT_RETURN_IF_ERROR(CudnnStatus(cudnnSetStream(handle_, stream), "cudnnSetStream"));
  bound_ = stream;
  return absl::OkStatus();
}

int CudnnRuntimeVersion() { return static_cast<int>(cudnnGetVersion()); }

// ------------------------------------------------------------- CudnnAttention

namespace {

// The cache key: everything a graph depends on.
using ShapeKey = std::tuple<int, int, int, int, int, bool, float>;

// [[maybe_unused]]: only the cudnn-frontend build keys its graph cache with it.
[[maybe_unused]] ShapeKey KeyOf(const AttentionShape& s) {
  return ShapeKey{s.batch,    s.q_heads,       s.kv_heads,     s.seq,
                  s.head_dim, /*causal=*/true, s.softmax_scale};
}

absl::Status CheckShape(const AttentionShape& s, absl::string_view op) {
  if (s.batch <= 0 || s.seq <= 0 || s.q_heads <= 0 || s.kv_heads <= 0 || s.head_dim <= 0 ||
      s.q_heads % s.kv_heads != 0 || !(s.softmax_scale > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": invalid attention shape (batch ", s.batch, ", seq ", s.seq, ", q_heads ", s.q_heads,
        ", kv_heads ", s.kv_heads, ", head_dim ", s.head_dim, ", scale ", s.softmax_scale, ")"));
  }
  return absl::OkStatus();
}

// The split's rules live in attention_select.h (CheckCudnnBackwardSplit); named for Prepare.
absl::Status CheckSplit(const AttentionShape& s, const CudnnBackwardSplit& split) {
  const absl::Status checked = CheckCudnnBackwardSplit(s, split);
  if (checked.ok()) return checked;
  return absl::InvalidArgumentError(
      absl::StrCat("CudnnAttention::Prepare: ", checked.message()));
}

}  // namespace

#if defined(MEGATRAIN_HAVE_CUDNN_FRONTEND)

namespace fe = cudnn_frontend;

namespace {

// Tensor UIDs of the variant packs.
enum Uid : int64_t {
  kQ = 1,
  kK = 2,
  kV = 3,
  kO = 4,
  kStats = 5,
  kDO = 6,
  kDQ = 7,
  kDK = 8,
  kDV = 9,
};

absl::Status FeStatus(fe::error_t e, absl::string_view context) {
  if (e.is_good()) return absl::OkStatus();
  const std::string message = absl::StrCat(context, ": cudnn-frontend: ", e.get_message());
  if (e.get_code() == fe::error_code_t::GRAPH_NOT_SUPPORTED) {
    return absl::UnimplementedError(message);
  }
  return absl::FailedPreconditionError(message);
}

// Dims take the shape of one call (CudnnBackwardCallShape), strides always
// the full tensors' layout: a call of a split backward sees a slice of them.
std::vector<int64_t> QDims(const AttentionShape& s) {
  return {s.batch, s.q_heads, s.seq, s.head_dim};
}
// [b, s, hq, d] storage seen as [b, hq, s, d].
std::vector<int64_t> QStrides(const AttentionShape& s) {
  const int64_t hd = int64_t{s.q_heads} * s.head_dim;
  return {int64_t{s.seq} * hd, s.head_dim, hd, 1};
}
std::vector<int64_t> KvDims(const AttentionShape& s) {
  return {s.batch, s.kv_heads, s.seq, s.head_dim};
}
std::vector<int64_t> KvStrides(const AttentionShape& s) {
  const int64_t hd = int64_t{s.kv_heads} * s.head_dim;
  return {int64_t{s.seq} * hd, s.head_dim, hd, 1};
}
// lse [b, hq, s] as [b, hq, s, 1].
std::vector<int64_t> StatsDims(const AttentionShape& s) { return {s.batch, s.q_heads, s.seq, 1}; }
std::vector<int64_t> StatsStrides(const AttentionShape& s) {
  return {int64_t{s.q_heads} * s.seq, s.seq, 1, 1};
}

std::shared_ptr<fe::graph::Graph> NewGraph() {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return graph;
}

std::shared_ptr<fe::graph::Tensor_attributes> Input(fe::graph::Graph& g, const char* name,
                                                    int64_t uid, std::vector<int64_t> dims,
                                                    std::vector<int64_t> strides,
                                                    fe::DataType_t type) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim(std::move(dims))
                      .set_stride(std::move(strides))
                      .set_data_type(type));
}

void MarkOutput(const std::shared_ptr<fe::graph::Tensor_attributes>& t, int64_t uid,
                std::vector<int64_t> dims, std::vector<int64_t> strides, fe::DataType_t type) {
  t->set_output(true).set_uid(uid).set_dim(std::move(dims)).set_stride(std::move(strides));
  t->set_data_type(type);
}

// validate -> operation graph -> heuristics (mode A, fallback) -> support -> plans.
absl::Status Build(fe::graph::Graph& g, cudnnHandle_t handle, absl::string_view what) {
  MT_RETURN_IF_ERROR(FeStatus(g.validate(), absl::StrCat(what, " validate")));
  MT_RETURN_IF_ERROR(
      FeStatus(g.build_operation_graph(handle), absl::StrCat(what, " build_operation_graph")));
  MT_RETURN_IF_ERROR(
      FeStatus(g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}),
               absl::StrCat(what, " create_execution_plans")));
  MT_RETURN_IF_ERROR(FeStatus(g.check_support(handle), absl::StrCat(what, " check_support")));
  MT_RETURN_IF_ERROR(FeStatus(g.build_plans(handle), absl::StrCat(what, " build_plans")));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> WorkspaceOf(const fe::graph::Graph& g, absl::string_view what) {
  int64_t bytes = 0;
  MT_RETURN_IF_ERROR(FeStatus(g.get_workspace_size(bytes), absl::StrCat(what, " workspace")));
  return bytes;
}

}  // namespace

struct CudnnAttention::Impl {
  struct Graphs {
    std::shared_ptr<fe::graph::Graph> forward;
    std::shared_ptr<fe::graph::Graph> backward;
    size_t forward_workspace = 0;
    size_t backward_workspace = 0;  // one call's
    CudnnBackwardSplit split;       // valid
  };

  CudnnHandle handle;
  std::map<ShapeKey, Graphs> cache;

  absl::StatusOr<Graphs> BuildGraphs(const AttentionShape& s, const CudnnBackwardSplit& split) {
    Graphs out;
    out.split = split;
    {  // Forward: O, Stats = sdpa(Q, K, V), causal (key j visible to query i iff j <= i).
      auto g = NewGraph();
      auto q = Input(*g, "Q", kQ, QDims(s), QStrides(s), fe::DataType_t::BFLOAT16);
      auto k = Input(*g, "K", kK, KvDims(s), KvStrides(s), fe::DataType_t::BFLOAT16);
      auto v = Input(*g, "V", kV, KvDims(s), KvStrides(s), fe::DataType_t::BFLOAT16);
      fe::graph::SDPA_attributes attrs;
      attrs.set_name("megatrain_sdpa_forward")
          .set_generate_stats(true)
          .set_causal_mask(true)
          .set_attn_scale(s.softmax_scale);
      auto [o, stats] = g->sdpa(q, k, v, attrs);
      MarkOutput(o, kO, QDims(s), QStrides(s), fe::DataType_t::BFLOAT16);
      MarkOutput(stats, kStats, StatsDims(s), StatsStrides(s), fe::DataType_t::FLOAT);
      MT_RETURN_IF_ERROR(Build(*g, handle.get(), "cuDNN attention forward"));
      absl::StatusOr<int64_t> ws = WorkspaceOf(*g, "cuDNN attention forward");
      if (!ws.ok()) return ws.status();
      out.forward = std::move(g);
      out.forward_workspace = static_cast<size_t>(*ws);
    }
    {  // Backward: dQ, dK, dV from Q, K, V, O, dO and the forward's Stats; deterministic.
       // One call's shape `c` over the full tensors' strides.
      const AttentionShape c = CudnnBackwardCallShape(s, split);
      auto g = NewGraph();
      auto q = Input(*g, "Q", kQ, QDims(c), QStrides(s), fe::DataType_t::BFLOAT16);
      auto k = Input(*g, "K", kK, KvDims(c), KvStrides(s), fe::DataType_t::BFLOAT16);
      auto v = Input(*g, "V", kV, KvDims(c), KvStrides(s), fe::DataType_t::BFLOAT16);
      auto o = Input(*g, "O", kO, QDims(c), QStrides(s), fe::DataType_t::BFLOAT16);
      auto d_o = Input(*g, "dO", kDO, QDims(c), QStrides(s), fe::DataType_t::BFLOAT16);
      // Stats as a packed tensor of the call's shape (cuDNN < 9.26 accepts no other): a call
      // takes every head (the full layout) or one batch item (whose b stride is never used).
      auto stats = Input(*g, "Stats", kStats, StatsDims(c), StatsStrides(c), fe::DataType_t::FLOAT);
      fe::graph::SDPA_backward_attributes attrs;
      attrs.set_name("megatrain_sdpa_backward")
          .set_causal_mask(true)
          .set_attn_scale(s.softmax_scale)
          .set_deterministic_algorithm(true);
      auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, d_o, stats, attrs);
      MarkOutput(dq, kDQ, QDims(c), QStrides(s), fe::DataType_t::BFLOAT16);
      MarkOutput(dk, kDK, KvDims(c), KvStrides(s), fe::DataType_t::BFLOAT16);
      MarkOutput(dv, kDV, KvDims(c), KvStrides(s), fe::DataType_t::BFLOAT16);
      MT_RETURN_IF_ERROR(Build(*g, handle.get(), "cuDNN attention backward"));
      absl::StatusOr<int64_t> ws = WorkspaceOf(*g, "cuDNN attention backward");
      if (!ws.ok()) return ws.status();
      out.backward = std::move(g);
      out.backward_workspace = static_cast<size_t>(*ws);
    }
    return out;
  }

  absl::StatusOr<const Graphs*> Find(const AttentionShape& s, absl::string_view op) const {
    auto it = cache.find(KeyOf(s));
    if (it == cache.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat(op, ": no graph for this shape; call CudnnAttention::Prepare first"));
    }
    return &it->second;
  }
};

absl::StatusOr<CudnnAttention> CudnnAttention::Create() {
  absl::StatusOr<CudnnHandle> handle = CudnnHandle::Create();
  if (!handle.ok()) return handle.status();
  auto impl = std::make_unique<Impl>();
  impl->handle = std::move(*handle);
  return CudnnAttention(std::move(impl));
}

absl::StatusOr<CudnnAttentionWorkspace> CudnnAttention::Prepare(const AttentionShape& shape,
                                                                CudnnBackwardSplit backward_split) {
  MT_RETURN_IF_ERROR(CheckShape(shape, "CudnnAttention::Prepare"));
  MT_RETURN_IF_ERROR(CheckSplit(shape, backward_split));
  if (!backward_split.valid()) backward_split = WholeCudnnBackward(shape);
  auto it = impl_->cache.find(KeyOf(shape));
  // Another split of a cached shape is built first and replaces the cached graphs only once
  // built: a refused rebuild leaves the shape as it was.
  if (it == impl_->cache.end() || !(it->second.split == backward_split)) {
    // cudnn-frontend throws where it finds no implementation for a node
    // (Graph::sdpa with AttentionImplementation_t::AUTO left unresolved):
    // a refusal like any other, so our kernel takes over.
    absl::StatusOr<Impl::Graphs> graphs = absl::InternalError("not built");
    try {
      graphs = impl_->BuildGraphs(shape, backward_split);
    } catch (const std::exception& e) {
      return absl::UnimplementedError(
          absl::StrCat("CudnnAttention::Prepare: cudnn-frontend threw: ", e.what()));
    }
    if (!graphs.ok()) return graphs.status();
    it = impl_->cache.insert_or_assign(KeyOf(shape), std::move(*graphs)).first;
  }
  return CudnnAttentionWorkspace{it->second.forward_workspace, it->second.backward_workspace};
}

absl::Status CudnnAttention::Forward(const AttentionShape& shape, const void* q, const void* k,
                                     const void* v, void* out, float* lse, void* workspace,
                                     size_t workspace_bytes, cudaStream_t stream) {
  constexpr absl::string_view kOp = "CudnnAttention::Forward";
  MT_RETURN_IF_ERROR(CheckStream(stream, kOp));
  absl::StatusOr<const Impl::Graphs*> found = impl_->Find(shape, kOp);
  if (!found.ok()) return found.status();
  const Impl::Graphs* graphs = *found;
  if (workspace_bytes < graphs->forward_workspace ||
      (graphs->forward_workspace > 0 && workspace == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": workspace_bytes = ", workspace_bytes,
                                                   " < required ", graphs->forward_workspace));
  }
  if (q == nullptr || k == nullptr || v == nullptr || out == nullptr || lse == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": a tensor pointer is null"));
  }
  MT_RETURN_IF_ERROR(impl_->handle.BindStream(stream));
  std::unordered_map<int64_t, void*> pack = {
      {kQ, const_cast<void*>(q)},
      {kK, const_cast<void*>(k)},
      {kV, const_cast<void*>(v)},
      {kO, out},
      {kStats, lse},
  };
  try {
    return FeStatus(graphs->forward->execute(impl_->handle.get(), pack, workspace), kOp);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(kOp, ": cudnn-frontend threw: ", e.what()));
  }
}

absl::Status CudnnAttention::Backward(const AttentionShape& shape, const void* q, const void* k,
                                      const void* v, const void* out, const void* dout,
                                      const float* lse, void* dq, void* dk, void* dv,
                                      void* workspace, size_t workspace_bytes,
                                      cudaStream_t stream) {
  constexpr absl::string_view kOp = "CudnnAttention::Backward";
  MT_RETURN_IF_ERROR(CheckStream(stream, kOp));
  absl::StatusOr<const Impl::Graphs*> found = impl_->Find(shape, kOp);
  if (!found.ok()) return found.status();
  const Impl::Graphs* graphs = *found;
  if (workspace_bytes < graphs->backward_workspace ||
      (graphs->backward_workspace > 0 && workspace == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": workspace_bytes = ", workspace_bytes,
                                                   " < required ", graphs->backward_workspace));
  }
  if (q == nullptr || k == nullptr || v == nullptr || out == nullptr || dout == nullptr ||
      lse == nullptr || dq == nullptr || dk == nullptr || dv == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": a tensor pointer is null"));
  }
  MT_RETURN_IF_ERROR(impl_->handle.BindStream(stream));
  // Each call's slice: batch items [bi, bi + b_c) and kv heads [hi, hi + g) with their query
  // heads, as element offsets into the [b, s, h, d] tensors and the [b, hq, s] statistics.
  const CudnnBackwardSplit split = graphs->split;
  const int64_t group = shape.q_heads / shape.kv_heads;
  const int64_t q_row = int64_t{shape.q_heads} * shape.head_dim;
  const int64_t kv_row = int64_t{shape.kv_heads} * shape.head_dim;
  const auto bf16_at = [&](const void* base, int64_t offset) {
    return const_cast<uint16_t*>(static_cast<const uint16_t*>(base)) + offset;
  };
  for (int bi = 0; bi < shape.batch; bi += split.batch_per_call) {
    for (int hi = 0; hi < shape.kv_heads; hi += split.kv_heads_per_call) {
      const int64_t q_offset = int64_t{bi} * shape.seq * q_row + hi * group * shape.head_dim;
      const int64_t kv_offset = int64_t{bi} * shape.seq * kv_row + int64_t{hi} * shape.head_dim;
      const int64_t stats_offset = (int64_t{bi} * shape.q_heads + hi * group) * int64_t{shape.seq};
      std::unordered_map<int64_t, void*> pack = {
          {kQ, bf16_at(q, q_offset)},     {kK, bf16_at(k, kv_offset)},
          {kV, bf16_at(v, kv_offset)},    {kO, bf16_at(out, q_offset)},
          {kDO, bf16_at(dout, q_offset)}, {kStats, const_cast<float*>(lse) + stats_offset},
          {kDQ, bf16_at(dq, q_offset)},   {kDK, bf16_at(dk, kv_offset)},
          {kDV, bf16_at(dv, kv_offset)},
      };
      try {
        MT_RETURN_IF_ERROR(
            FeStatus(graphs->backward->execute(impl_->handle.get(), pack, workspace), kOp));
      } catch (const std::exception& e) {
        return absl::InternalError(absl::StrCat(kOp, ": cudnn-frontend threw: ", e.what()));
      }
    }
  }
  return absl::OkStatus();
}

#else  // !MEGATRAIN_HAVE_CUDNN_FRONTEND

struct CudnnAttention::Impl {};

namespace {
absl::Status NotBuilt(absl::string_view op) {
  return absl::UnimplementedError(
      absl::StrCat(op, ": built without the cudnn-frontend headers (scripts/setup installs them)"));
}
}  // namespace

absl::StatusOr<CudnnAttention> CudnnAttention::Create() {
  return NotBuilt("CudnnAttention::Create");
}
absl::StatusOr<CudnnAttentionWorkspace> CudnnAttention::Prepare(const AttentionShape& shape,
                                                                CudnnBackwardSplit backward_split) {
  MT_RETURN_IF_ERROR(CheckShape(shape, "CudnnAttention::Prepare"));
  MT_RETURN_IF_ERROR(CheckSplit(shape, backward_split));
  return NotBuilt("CudnnAttention::Prepare");
}
absl::Status CudnnAttention::Forward(const AttentionShape&, const void*, const void*, const void*,
                                     void*, float*, void*, size_t, cudaStream_t) {
  return NotBuilt("CudnnAttention::Forward");
}
absl::Status CudnnAttention::Backward(const AttentionShape&, const void*, const void*, const void*,
                                      const void*, const void*, const float*, void*, void*, void*,
                                      void*, size_t, cudaStream_t) {
  return NotBuilt("CudnnAttention::Backward");
}

#endif  // MEGATRAIN_HAVE_CUDNN_FRONTEND

CudnnAttention::CudnnAttention(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudnnAttention::CudnnAttention(CudnnAttention&&) noexcept = default;
CudnnAttention& CudnnAttention::operator=(CudnnAttention&&) noexcept = default;
CudnnAttention::~CudnnAttention() = default;

}  // namespace megatrain::kernels::cuda
