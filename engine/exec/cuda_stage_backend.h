// The CUDA device's StageBackend: bf16 weights and activations on the GPU,
// fp32 gradients, every stage enqueued on the compute stream's cudaStream_t
// through engine/exec/cuda_layer_math; the embedding stays on the host.
#pragma once

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/device/device.h"
#include "engine/exec/model_dims.h"
#include "engine/exec/stage_backend.h"
#include "kernels/cpu/rope.h"

namespace megatrain::engine {

// Where Bind carves each piece of the backend's scratch (byte offsets from
// its 256-byte aligned base; every piece 256-byte aligned).
struct CudaScratchPlan {
  size_t backward_offset = 0;      // CudaBackwardScratch
  size_t head_offset = 0;          // CudaHeadScratch
  size_t tables_offset = 0;        // CudaLayerMath's tables (RoPE, ones)
  size_t chunk_losses_offset = 0;  // fp32 [HeadChunkCount] per-chunk loss sums of a head
  size_t total_bytes = 0;          // == CudaStageSizes(dims).scratch_bytes
};

// Host-only; meaningful for dims CudaLayerMath::Validate accepts.
CudaScratchPlan PlanCudaScratch(const ModelDims& dims);

// Sizes of the CUDA backend: bf16 weights and activations, one CudaActivations
// per saved set, scratch of PlanCudaScratch(dims).total_bytes.
StageSizes CudaStageSizes(const ModelDims& dims);

// Pinned host bytes MakeCudaStageBackend takes from the device's budget (the
// per-chunk losses the heads download).
size_t CudaStageBackendPinnedBytes(const ModelDims& dims);

// Validates dims, offsets and rope with CudaLayerMath::Validate (errors name
// the field) before touching `device`, then allocates the pinned chunk-loss
// array. Nothing CUDA runs until Bind, which needs CUDA streams (any other
// Stream is an InvalidArgument naming it). `rope` must outlive Bind;
// `device` must outlive the backend.
absl::StatusOr<std::unique_ptr<StageBackend>> MakeCudaStageBackend(
    Device& device, const ModelDims& dims, const LayerOffsets& offsets,
    const kernels::cpu::RopeTable& rope);

}  // namespace megatrain::engine
