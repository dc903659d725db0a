// The attention selection rules (attention_select.h): host only.
#include "kernels/cuda/attention_select.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace megatrain::kernels::cuda {
namespace {

size_t RoundUp(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

bool ShapeValid(const AttentionShape& s) {
  return s.batch > 0 && s.seq > 0 && s.q_heads > 0 && s.kv_heads > 0 && s.head_dim > 0 &&
         s.q_heads % s.kv_heads == 0 && s.softmax_scale > 0.0f;
}

AttentionChoice Own(std::string reason) {
  return AttentionChoice{AttentionImpl::kOwnKernel, std::move(reason)};
}

}  // namespace

const char* AttentionImplName(AttentionImpl impl) {
  return impl == AttentionImpl::kCudnn ? "cudnn" : "own-kernel";
}

bool CudnnAttentionAllowedByEnvValue(const char* value) {
  if (value == nullptr) return true;
  const std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(value));
  return !(v == "0" || v == "off" || v == "false" || v == "no" || v == "ours");
}

bool CudnnAttentionAllowedByEnv() {
  return CudnnAttentionAllowedByEnvValue(std::getenv(kCudnnAttentionEnv));
}

bool CudnnAttentionBuilt() {
#if defined(MEGATRAIN_HAVE_CUDNN_FRONTEND)
  return true;
#else
  return false;
#endif
}

AttentionChoice SelectAttentionImpl(const AttentionShape& s, const AttentionSelectInputs& in) {
  if (s.segments != nullptr) {
    return Own("segment ids (packed samples): cuDNN's fused attention here is causal over whole "
               "sequences");
  }
  if (!in.cudnn_enabled) return Own("cuDNN attention is off (option or MEGATRAIN_CUDNN_ATTENTION)");
  if (!in.cudnn_built) {
    return Own("built without the cudnn-frontend headers (scripts/setup installs them)");
  }
  if (!ShapeValid(s)) return Own("attention shape is not valid");
  if (in.sm_major != 0 && in.sm_major < 8) {
    return Own(absl::StrCat("compute capability ", in.sm_major,
                            ".x has no cuDNN fused attention (needs 8.0+)"));
  }
  if (in.cudnn_version != 0 && in.cudnn_version < 90000) {
    return Own(absl::StrCat("cuDNN ", in.cudnn_version, " is older than 9.0"));
  }
  if (s.head_dim % 8 != 0 || s.head_dim > 256) {
    return Own(absl::StrCat("head_dim = ", s.head_dim,
                            " (cuDNN fused attention: a multiple of 8, at most 256)"));
  }
  if (s.head_dim > 128 && in.sm_major != 0 && in.sm_major < 9) {
    return Own(absl::StrCat("head_dim = ", s.head_dim, " > 128 needs Hopper or newer for cuDNN"));
  }
  const CudnnBackwardSplit split = SplitCudnnAttentionBackward(s, in.workspace_cap_bytes);
  if (!split.valid() && s.seq % 4 != 0) {
    return Own(absl::StrCat("cuDNN attention workspace estimate ",
                            CudnnAttentionBackwardWorkspaceEstimateBytes(s), " bytes > cap ",
                            in.workspace_cap_bytes, ", and seq = ", s.seq,
                            " is not a multiple of 4, so the backward cannot be cut into calls"));
  }
  if (!split.valid()) {
    return Own(absl::StrCat("cuDNN attention workspace estimate ",
                            CudnnAttentionBackwardWorkspaceEstimateBytes(
                                CudnnBackwardCallShape(s, CudnnBackwardSplit{1, 1})),
                            " bytes for one batch item and one kv head > cap ",
                            in.workspace_cap_bytes));
  }
  if (split == WholeCudnnBackward(s)) {
    return AttentionChoice{AttentionImpl::kCudnn, "cuDNN fused attention"};
  }
  return AttentionChoice{
      AttentionImpl::kCudnn,
      absl::StrCat("cuDNN fused attention, backward in ",
                   (s.batch / split.batch_per_call) * (s.kv_heads / split.kv_heads_per_call),
                   " calls of ", split.batch_per_call, " batch item(s) x ", split.kv_heads_per_call,
                   " kv head(s) (workspace cap ", in.workspace_cap_bytes, " bytes)")};
}

CudnnBackwardSplit WholeCudnnBackward(const AttentionShape& s) {
  return CudnnBackwardSplit{s.batch, s.kv_heads};
}

AttentionShape CudnnBackwardCallShape(const AttentionShape& s, const CudnnBackwardSplit& split) {
  AttentionShape call = s;
  if (!split.valid() || s.kv_heads <= 0) return call;
  call.batch = split.batch_per_call;
  call.q_heads = s.q_heads / s.kv_heads * split.kv_heads_per_call;
  call.kv_heads = split.kv_heads_per_call;
  return call;
}

absl::Status CheckCudnnBackwardSplit(const AttentionShape& s, const CudnnBackwardSplit& split) {
  if (split == CudnnBackwardSplit{} || split == WholeCudnnBackward(s)) return absl::OkStatus();
  if (!split.valid()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backward split of ", split.batch_per_call, " batch item(s) x ", split.kv_heads_per_call,
        " kv head(s): both must be positive ({0, 0} = one call)"));
  }
  if (s.seq % 4 != 0) {  // each call's slice of the fp32 statistics must be 16-byte aligned
    return absl::InvalidArgumentError(absl::StrCat(
        "a split backward needs seq a multiple of 4 (16-byte aligned statistics slices); seq = ",
        s.seq));
  }
  // cuDNN before 9.26 reads the backward's statistics only as a packed [b, h, s] tensor: a
  // call's slice is packed when it takes every head or a single batch item.
  if (split.batch_per_call > 1 && split.kv_heads_per_call < s.kv_heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a backward call takes every kv head or one batch item (packed statistics); split ",
        split.batch_per_call, " x ", split.kv_heads_per_call));
  }
  if (s.batch % split.batch_per_call != 0 || s.kv_heads % split.kv_heads_per_call != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("backward split of ", split.batch_per_call, " batch item(s) x ",
                     split.kv_heads_per_call, " kv head(s) does not divide batch ", s.batch,
                     " x kv_heads ", s.kv_heads));
  }
  return absl::OkStatus();
}

CudnnBackwardSplit SplitCudnnAttentionBackward(const AttentionShape& s, size_t cap) {
  if (!ShapeValid(s)) return {};
  if (cap == 0) return WholeCudnnBackward(s);
  CudnnBackwardSplit best;
  int64_t best_per_call = 0;
  for (int b = s.batch; b >= 1; --b) {
    for (int g = s.kv_heads; g >= 1; --g) {
      const CudnnBackwardSplit split{b, g};
      if (!CheckCudnnBackwardSplit(s, split).ok() ||
          CudnnAttentionBackwardWorkspaceEstimateBytes(CudnnBackwardCallShape(s, split)) > cap) {
        continue;
      }
      const int64_t per_call = int64_t{b} * g;  // fewest calls = most units per call
      if (per_call > best_per_call) {
        best = split;
        best_per_call = per_call;
      }
    }
  }
  return best;
}

size_t CudnnAttentionBackwardWorkspaceEstimateBytes(const AttentionShape& s) {
  if (!ShapeValid(s)) return 0;
  const size_t b = static_cast<size_t>(s.batch);
  const size_t h = static_cast<size_t>(s.q_heads);
  const size_t seq = static_cast<size_t>(s.seq);
  const size_t d = static_cast<size_t>(s.head_dim);
  const size_t s64 = RoundUp(seq, 64);
  const size_t d_p = b * h * s64 * s64 * 2;     // bf16 dP (deterministic path)
  const size_t dq_accum = b * h * seq * d * 4;  // fp32 dQ accumulator
  const size_t row_sums = 2 * b * h * seq * 4;  // fp32 softmax sums / dO.O rows
  return RoundUp(d_p, 256) + RoundUp(dq_accum, 256) + RoundUp(row_sums, 256) + (size_t{1} << 20);
}

size_t CudnnAttentionForwardWorkspaceEstimateBytes(const AttentionShape& s) {
  if (!ShapeValid(s)) return 0;
  const size_t rows =
      static_cast<size_t>(s.batch) * static_cast<size_t>(s.q_heads) * static_cast<size_t>(s.seq);
  return RoundUp(2 * rows * 4, 256) + (size_t{1} << 20);
}

size_t AttentionForwardWorkspaceBytes(const AttentionShape& shape, AttentionImpl impl) {
  return impl == AttentionImpl::kCudnn ? CudnnAttentionForwardWorkspaceEstimateBytes(shape) : 0;
}

size_t AttentionWorkspaceBytes(const AttentionShape& shape, AttentionImpl impl) {
  const size_t own = AttentionBackwardWorkspaceBytes(shape);
  if (impl == AttentionImpl::kOwnKernel) return own;
  const CudnnBackwardSplit split =
      SplitCudnnAttentionBackward(shape, kDefaultCudnnAttentionWorkspaceCap);
  if (!split.valid()) return own;  // the selection runs our kernel for this shape
  return std::max(
      own, CudnnAttentionBackwardWorkspaceEstimateBytes(CudnnBackwardCallShape(shape, split)));
}

}  // namespace megatrain::kernels::cuda
