// Which attention runs: cuDNN's fused scaled-dot-product attention (tensor
// cores, cudnn_attention.h) or our own kernel (attention.cu: fp32 on CUDA
// cores, the checker and the fallback). Pure host functions, no CUDA calls,
// so the rules are unit-tested on any machine; the device facts they need
// (compute capability, cuDNN version) are passed in, 0 meaning "not known
// yet" (the planner sizes memory before a device exists and assumes
// eligible; CudaLayerMath::Create decides again with the real device).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "kernels/cuda/ops.h"

namespace megatrain::kernels::cuda {

enum class AttentionImpl {
  kOwnKernel,  // attention.cu
  kCudnn,      // cudnn_attention.h
};

const char* AttentionImplName(AttentionImpl impl);

// The environment variable that turns cuDNN attention off for a process
// ("0", "off", "false", "no", "ours" = our kernel; unset, "", "1", "on"
// = allowed). Read once at the edge (CudaLayerMath's options) and by the
// scratch sizing, never inside a step.
inline constexpr char kCudnnAttentionEnv[] = "MEGATRAIN_CUDNN_ATTENTION";

// Parses a value of kCudnnAttentionEnv (nullptr = unset): false = off.
bool CudnnAttentionAllowedByEnvValue(const char* value);
// CudnnAttentionAllowedByEnvValue(getenv(kCudnnAttentionEnv)).
bool CudnnAttentionAllowedByEnv();

// True when this binary was built with the cudnn-frontend headers
// (MEGATRAIN_HAVE_CUDNN_FRONTEND; scripts/setup installs them).
bool CudnnAttentionBuilt();

// The largest workspace one call of cuDNN's attention backward may use: 16 GiB.
// The deterministic backward's dP buffer grows with batch * heads * seq^2
// (measured on an H200 with cuDNN 9.14: 1.18 GB at micro-batch 16, 28 heads,
// seq 1024; 60 GB at micro-batch 1, seq 32768), so a shape over the cap is cut
// into calls by batch items and kv-head groups (CudnnBackwardSplit) before it
// falls back to our kernel: Qwen2.5-7B at seq 32768 (7 query heads per kv
// head) needs 15.2 GB a call.
inline constexpr size_t kDefaultCudnnAttentionWorkspaceCap = size_t{16} << 30;

struct AttentionSelectInputs {
  bool cudnn_enabled = true;  // the option (CudaLayerMathOptions::cudnn_attention, env)
  bool cudnn_built = false;   // CudnnAttentionBuilt()
  int sm_major = 0;           // compute capability major; 0 = unknown (assume eligible)
  int cudnn_version = 0;      // cudnnGetVersion(), e.g. 91900; 0 = unknown
  size_t workspace_cap_bytes = kDefaultCudnnAttentionWorkspaceCap;  // 0 = no cap
};

struct AttentionChoice {
  AttentionImpl impl = AttentionImpl::kOwnKernel;
  std::string reason;  // why, for logs ("cuDNN fused attention" or the refusal)
};

// The rules, in order (the first that matches decides):
//  0. segment ids (shape.segments, packed samples)   -> our kernel: our cuDNN graphs are plain
//     causal over whole sequences; attending across samples would be silently wrong
//  1. cuDNN off by option or environment            -> our kernel
//  2. built without the cudnn-frontend headers       -> our kernel
//  3. shape not valid (sizes <= 0, q_heads not a multiple of kv_heads,
//     softmax_scale <= 0)                             -> our kernel (which reports it)
//  4. compute capability known and < 8.0             -> our kernel (no fused flash attention)
//  5. cuDNN version known and < 9.0                  -> our kernel
//  6. head_dim not a multiple of 8, or > 256         -> our kernel
//  7. head_dim > 128 on a known pre-Hopper device    -> our kernel
//  8. no CudnnBackwardSplit within the cap (one batch item and one kv head's
//     query heads already estimate more, or seq is not a multiple of 4 and
//     the whole shape does)                          -> our kernel
//  otherwise                                          -> cuDNN
// The forward and the backward of a run always use the same choice (the
// caller decides once per shape), so the saved statistics are always read by
// the implementation that wrote them.
AttentionChoice SelectAttentionImpl(const AttentionShape& shape, const AttentionSelectInputs& in);

// An upper estimate of the device workspace cuDNN's causal deterministic
// SDPA backward needs for `shape`: with cuDNN 9.x before 9.25 the deterministic backward
// on Hopper keeps the bf16 dP matrix [b, q_heads, s64, s64] (s64 = seq rounded
// up to 64), an fp32 dQ accumulator [b, q_heads, s, d] and fp32 row sums
// [b, q_heads, s], plus 1 MiB of slack. The plan's real figure is checked
// against what was reserved when the graphs are built (a larger one falls back
// to our kernel). 0 for an invalid shape.
size_t CudnnAttentionBackwardWorkspaceEstimateBytes(const AttentionShape& shape);

// How cuDNN's deterministic backward of one shape is cut into calls so each
// call's workspace stays within a cap: each call takes `batch_per_call` batch
// items and `kv_heads_per_call` kv heads with all their query heads (GQA
// groups stay whole, so every dK/dV is still summed by cuDNN in one call).
// Both divide the shape's batch and kv_heads, so every call has one shape
// and the calls together cover the tensors exactly once. A call takes every
// head or a single batch item: cuDNN before 9.26 reads the statistics only
// as a packed [b, h, s] tensor, and only those slices of ours are packed. The forward is
// never cut (its workspace does not grow with seq^2).
struct CudnnBackwardSplit {
  int batch_per_call = 0;
  int kv_heads_per_call = 0;
  bool valid() const { return batch_per_call > 0 && kv_heads_per_call > 0; }
  bool operator==(const CudnnBackwardSplit&) const = default;
};

// The split with the fewest calls whose per-call estimate is within `cap`
// (0 = no cap: one call); ties keep more batch items per call. A shape whose
// seq is not a multiple of 4 is never cut (each call's slice of the fp32
// statistics must start 16-byte aligned). Invalid ({0, 0}) when one batch
// item and one kv head already exceed the cap (or the whole shape does and
// it cannot be cut), or the shape is invalid.
CudnnBackwardSplit SplitCudnnAttentionBackward(const AttentionShape& shape, size_t cap);

// The whole shape as one call.
CudnnBackwardSplit WholeCudnnBackward(const AttentionShape& shape);

// OK when `split` cuts `shape` into calls cuDNN takes: {0, 0} or the whole shape (one call), or
// positive counts dividing batch and kv_heads, each call taking every kv head or one batch item,
// seq a multiple of 4. Else InvalidArgument naming the rule. SplitCudnnAttentionBackward only
// picks splits this accepts; CudnnAttention::Prepare refuses the others.
absl::Status CheckCudnnBackwardSplit(const AttentionShape& shape, const CudnnBackwardSplit& split);

// The shape one call of `split` sees: batch, q_heads and kv_heads cut.
AttentionShape CudnnBackwardCallShape(const AttentionShape& shape, const CudnnBackwardSplit& split);

// The same for the forward (fp32 row statistics [b, q_heads, s] twice plus
// 1 MiB; cuDNN 9's fused forward usually asks for none). 0 for an invalid shape.
size_t CudnnAttentionForwardWorkspaceEstimateBytes(const AttentionShape& shape);

// Bytes of the backward attention workspace to reserve for `impl`: our
// backward's scratch, or the max of that and the cuDNN estimate of one call
// of the default cap's split (so a fallback at run time always has room for
// our kernel).
size_t AttentionWorkspaceBytes(const AttentionShape& shape, AttentionImpl impl);
// Bytes of the forward attention workspace to reserve for `impl` (our
// forward needs none).
size_t AttentionForwardWorkspaceBytes(const AttentionShape& shape, AttentionImpl impl);

}  // namespace megatrain::kernels::cuda
