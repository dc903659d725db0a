// CUDA kernels + launchers: embedding gather/scatter-add, residual add, fp32
// gradient accumulation, fp32 to bf16 rounding, SwiGLU
// and RoPE, each a thin grid over thread_bodies.h (kernels/common math).
#include "kernels/cuda/bf16_storage.h"
#include "kernels/cuda/launch_geometry.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/thread_bodies.h"

namespace megatrain::kernels::cuda {
namespace {

using S = Bf16Storage;
using bf16 = __nv_bfloat16;

__device__ __forceinline__ int64_t ThisElement() {
  return ElementIndex(blockIdx.x, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x));
}

__global__ void EmbeddingForwardKernel(const int32_t* ids, int64_t n, const bf16* table,
                                       int64_t vocab, int dim, bf16* out) {
  EmbeddingForwardThread<S>(ThisElement(), n, ids, table, vocab, dim, out);
}

__global__ void EmbeddingBackwardKernel(const int32_t* unique_rows, const int32_t* offsets,
                                        const int32_t* order, const bf16* dout, int dim,
                                        float* dtable) {
  EmbeddingBackwardThread<S>(
      blockIdx.x,
      ColumnIndex(blockIdx.y, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x)),
      unique_rows, offsets, order, dout, dim, dtable);
}

__global__ void ResidualAddKernel(const bf16* a, const bf16* b, bf16* out, int64_t n) {
  ResidualAddThread<S>(ThisElement(), n, a, b, out);
}

__global__ void AccumulateFp32Kernel(const float* g, float* sum, int64_t n) {
  AccumulateFp32Thread(ThisElement(), n, g, sum);
}

__global__ void RoundToBf16Kernel(const float* in, bf16* out, int64_t n) {
  RoundToStorageThread<S>(ThisElement(), n, in, out);
}

__global__ void SwigluForwardKernel(const bf16* gate, const bf16* up, bf16* out, int64_t n) {
  SwigluForwardThread<S>(ThisElement(), n, gate, up, out);
}

__global__ void SwigluBackwardKernel(const bf16* gate, const bf16* up, const bf16* dy, bf16* d_gate,
                                     bf16* d_up, int64_t n) {
  SwigluBackwardThread<S>(ThisElement(), n, gate, up, dy, d_gate, d_up);
}

__global__ void RopeKernel(bf16* x, int64_t pairs, int heads, int head_dim, int seq,
                           const float* cos_table, const float* sin_table,
                           const int32_t* positions, bool backward) {
  RopeThread<S>(ThisElement(), pairs, x, heads, head_dim, seq, cos_table, sin_table, positions,
                backward);
}

dim3 Grid(const LaunchShape& shape) {
  return dim3(static_cast<unsigned>(shape.blocks_x), static_cast<unsigned>(shape.blocks_y), 1);
}

}  // namespace

namespace launch {

cudaError_t EmbeddingForward(const int32_t* ids, int64_t tokens, const bf16* table, int64_t vocab,
                             int dim, bf16* out, cudaStream_t stream) {
  const int64_t n = tokens * dim;
  const LaunchShape shape = ElementwiseGrid(n);
  EmbeddingForwardKernel<<<Grid(shape), shape.threads, 0, stream>>>(ids, n, table, vocab, dim, out);
  return cudaGetLastError();
}

cudaError_t EmbeddingBackward(const int32_t* unique_rows, const int32_t* segment_offsets,
                              const int32_t* token_order, int64_t unique_count, const bf16* dout,
                              int dim, float* dtable, cudaStream_t stream) {
  const LaunchShape shape = EmbeddingBackwardGrid(unique_count, dim);
  EmbeddingBackwardKernel<<<Grid(shape), shape.threads, 0, stream>>>(
      unique_rows, segment_offsets, token_order, dout, dim, dtable);
  return cudaGetLastError();
}

cudaError_t RoundToBf16(const float* in, bf16* out, int64_t n, cudaStream_t stream) {
  const LaunchShape shape = ElementwiseGrid(n);
  RoundToBf16Kernel<<<Grid(shape), shape.threads, 0, stream>>>(in, out, n);
  return cudaGetLastError();
}

cudaError_t ResidualAdd(const bf16* a, const bf16* b, bf16* out, int64_t n, cudaStream_t stream) {
  const LaunchShape shape = ElementwiseGrid(n);
  ResidualAddKernel<<<Grid(shape), shape.threads, 0, stream>>>(a, b, out, n);
  return cudaGetLastError();
}

cudaError_t AccumulateFp32(const float* g, float* sum, int64_t n, cudaStream_t stream) {
  const LaunchShape shape = ElementwiseGrid(n);
  AccumulateFp32Kernel<<<Grid(shape), shape.threads, 0, stream>>>(g, sum, n);
  return cudaGetLastError();
}

cudaError_t SwigluForward(const bf16* gate, const bf16* up, bf16* out, int64_t n,
                          cudaStream_t stream) {
  const LaunchShape shape = ElementwiseGrid(n);
  SwigluForwardKernel<<<Grid(shape), shape.threads, 0, stream>>>(gate, up, out, n);
  return cudaGetLastError();
}

cudaError_t SwigluBackward(const bf16* gate, const bf16* up, const bf16* dy, bf16* d_gate,
                           bf16* d_up, int64_t n, cudaStream_t stream) {
  const LaunchShape shape = ElementwiseGrid(n);
  SwigluBackwardKernel<<<Grid(shape), shape.threads, 0, stream>>>(gate, up, dy, d_gate, d_up, n);
  return cudaGetLastError();
}

cudaError_t Rope(bf16* x, int64_t tokens, int heads, int head_dim, int seq, const float* cos_table,
                 const float* sin_table, const int32_t* positions, bool backward,
                 cudaStream_t stream) {
  const int64_t pairs = tokens * heads * (head_dim / 2);
  const LaunchShape shape = ElementwiseGrid(pairs);
  RopeKernel<<<Grid(shape), shape.threads, 0, stream>>>(x, pairs, heads, head_dim, seq, cos_table,
                                                        sin_table, positions, backward);
  return cudaGetLastError();
}

}  // namespace launch
}  // namespace megatrain::kernels::cuda
