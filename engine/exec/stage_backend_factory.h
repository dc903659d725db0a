// The StageBackend of a device kind: its sizes (for planning, before any
// device exists) and the backend itself (CPU math or CUDA).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/common/thread_pool.h"
#include "engine/device/device.h"
#include "engine/exec/model_dims.h"
#include "engine/exec/stage_backend.h"
#include "kernels/cpu/rope.h"

namespace megatrain::engine {

StageSizes StageSizesFor(DeviceKind kind, const ModelDims& dims);

// `rope` and `compute_pool` (may be null; the CPU backend's) must outlive it.
absl::StatusOr<std::unique_ptr<StageBackend>> MakeStageBackend(Device& device,
                                                               const ModelDims& dims,
                                                               const LayerOffsets& offsets,
                                                               const kernels::cpu::RopeTable& rope,
                                                               ThreadPool* compute_pool);

}  // namespace megatrain::engine
