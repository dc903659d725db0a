// CUDA causal GQA attention, FlashAttention-2 style (our own kernels, fp32 math on CUDA cores,
// correctness first): the __global__ kernels and their launchers. The bodies, their
// shared-memory tiles and launch shapes live in attention_bodies.h (replayed on the CPU under the
// block emulator by attention_bodies_test), which also documents the layouts and the rules.
#include "kernels/cuda/attention_bodies.h"
#include "kernels/cuda/bf16_storage.h"
#include "kernels/cuda/launch_geometry.h"
#include "kernels/cuda/launchers.h"

namespace megatrain::kernels::cuda {
namespace {

using S = Bf16Storage;
using bf16 = __nv_bfloat16;

template <int D>
__global__ void __launch_bounds__(kAttnThreads)
    AttentionForwardKernel(AttentionKernelDims dims, const bf16* q, const bf16* k, const bf16* v,
                           bf16* out, float* lse) {
  __shared__ float k_tile[kAttnTile][D];
  __shared__ float v_tile[kAttnTile][D];
  __shared__ int32_t key_segments[kAttnTile];
  static_assert(sizeof(k_tile) + sizeof(v_tile) + sizeof(key_segments) ==
                AttentionKeyTiles<D>::Bytes());
  AttentionForwardBlock<S, D>(dims, q, k, v, out, lse,
                              AttentionKeyTiles<D>{k_tile, v_tile, key_segments});
}

template <int D>
__global__ void __launch_bounds__(kAttnThreads)
    AttentionDeltaKernel(AttentionKernelDims dims, const bf16* out, const bf16* dout,
                         float* delta) {
  AttentionDeltaBlock<S, D>(dims, out, dout, delta);
}

template <int D>
__global__ void __launch_bounds__(kAttnThreads)
    AttentionDkDvKernel(AttentionKernelDims dims, const bf16* q, const bf16* k, const bf16* v,
                        const bf16* dout, const float* lse, const float* delta, bf16* dk,
                        bf16* dv) {
  __shared__ float q_tile[kAttnTile][D];
  __shared__ float do_tile[kAttnTile][D];
  __shared__ float lse_tile[kAttnTile];
  __shared__ float delta_tile[kAttnTile];
  __shared__ int32_t query_segments[kAttnTile];
  static_assert(sizeof(q_tile) + sizeof(do_tile) + sizeof(lse_tile) + sizeof(delta_tile) +
                    sizeof(query_segments) ==
                AttentionQueryTiles<D>::Bytes());
  AttentionDkDvBlock<S, D>(
      dims, q, k, v, dout, lse, delta, dk, dv,
      AttentionQueryTiles<D>{q_tile, do_tile, lse_tile, delta_tile, query_segments});
}

template <int D>
__global__ void __launch_bounds__(kAttnThreads)
    AttentionDqKernel(AttentionKernelDims dims, const bf16* q, const bf16* k, const bf16* v,
                      const bf16* dout, const float* lse, const float* delta, bf16* dq) {
  __shared__ float k_tile[kAttnTile][D];
  __shared__ float v_tile[kAttnTile][D];
  __shared__ int32_t key_segments[kAttnTile];
  static_assert(sizeof(k_tile) + sizeof(v_tile) + sizeof(key_segments) ==
                AttentionKeyTiles<D>::Bytes());
  AttentionDqBlock<S, D>(dims, q, k, v, dout, lse, delta, dq,
                         AttentionKeyTiles<D>{k_tile, v_tile, key_segments});
}

dim3 Grid(const LaunchShape& shape) {
  return dim3(static_cast<unsigned>(shape.blocks_x), static_cast<unsigned>(shape.blocks_y), 1);
}

AttentionKernelDims ToDims(const launch::AttentionDims& d) {
  return AttentionKernelDims{d.batch, d.seq, d.q_heads, d.kv_heads, d.softmax_scale, d.segments};
}

// Every attention kernel declares its shared memory statically (AttentionLaunch::shared_bytes
// says how much), so no launch asks for dynamic shared memory.
constexpr size_t kNoDynamicShared = 0;

template <int D>
cudaError_t Forward(const launch::AttentionDims& d, const bf16* q, const bf16* k, const bf16* v,
                    bf16* out, float* lse, cudaStream_t stream) {
  const AttentionKernelDims dims = ToDims(d);
  const LaunchShape shape = AttentionLaunchOf<D>(AttentionPass::kForward, dims).shape;
  AttentionForwardKernel<D>
      <<<Grid(shape), shape.threads, kNoDynamicShared, stream>>>(dims, q, k, v, out, lse);
  return cudaGetLastError();
}

template <int D>
cudaError_t Backward(const launch::AttentionDims& d, const bf16* q, const bf16* k, const bf16* v,
                     const bf16* out, const bf16* dout, const float* lse, float* delta, bf16* dq,
                     bf16* dk, bf16* dv, cudaStream_t stream) {
  const AttentionKernelDims dims = ToDims(d);
  const LaunchShape delta_shape = AttentionLaunchOf<D>(AttentionPass::kDelta, dims).shape;
  AttentionDeltaKernel<D><<<Grid(delta_shape), delta_shape.threads, kNoDynamicShared, stream>>>(
      dims, out, dout, delta);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const LaunchShape dkdv_shape = AttentionLaunchOf<D>(AttentionPass::kDkDv, dims).shape;
  AttentionDkDvKernel<D><<<Grid(dkdv_shape), dkdv_shape.threads, kNoDynamicShared, stream>>>(
      dims, q, k, v, dout, lse, delta, dk, dv);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const LaunchShape dq_shape = AttentionLaunchOf<D>(AttentionPass::kDq, dims).shape;
  AttentionDqKernel<D><<<Grid(dq_shape), dq_shape.threads, kNoDynamicShared, stream>>>(
      dims, q, k, v, dout, lse, delta, dq);
  return cudaGetLastError();
}

}  // namespace

namespace launch {

cudaError_t AttentionForward(const AttentionDims& dims, const bf16* q, const bf16* k, const bf16* v,
                             bf16* out, float* lse, cudaStream_t stream) {
  switch (dims.head_dim) {
    case 64:
      return Forward<64>(dims, q, k, v, out, lse, stream);
    case 128:
      return Forward<128>(dims, q, k, v, out, lse, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t AttentionBackward(const AttentionDims& dims, const bf16* q, const bf16* k,
                              const bf16* v, const bf16* out, const bf16* dout, const float* lse,
                              float* delta, bf16* dq, bf16* dk, bf16* dv, cudaStream_t stream) {
  switch (dims.head_dim) {
    case 64:
      return Backward<64>(dims, q, k, v, out, dout, lse, delta, dq, dk, dv, stream);
    case 128:
      return Backward<128>(dims, q, k, v, out, dout, lse, delta, dq, dk, dv, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace launch
}  // namespace megatrain::kernels::cuda
