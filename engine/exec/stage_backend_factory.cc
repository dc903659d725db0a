// The StageBackend of a device kind.
#include "engine/exec/stage_backend_factory.h"

#include "engine/exec/cuda_stage_backend.h"

namespace megatrain::engine {

StageSizes StageSizesFor(DeviceKind kind, const ModelDims& dims) {
  return kind == DeviceKind::kCuda ? CudaStageSizes(dims) : CpuStageSizes(dims);
}

absl::StatusOr<std::unique_ptr<StageBackend>> MakeStageBackend(Device& device,
                                                               const ModelDims& dims,
                                                               const LayerOffsets& offsets,
                                                               const kernels::cpu::RopeTable& rope,
                                                               ThreadPool* compute_pool) {
  if (device.kind() == DeviceKind::kCuda) return MakeCudaStageBackend(device, dims, offsets, rope);
  return MakeCpuStageBackend(dims, offsets, rope, compute_pool);
}

}  // namespace megatrain::engine
