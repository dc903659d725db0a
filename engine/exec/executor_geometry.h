// The streaming executor's shapes for a model and micro-batch, derived from
// the config and the parameter layout without allocating anything: used by
// the trainer to build its executor and by the planner to predict it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/exec/model_dims.h"
#include "engine/exec/streaming_executor.h"
#include "engine/model/model_config.h"
#include "engine/model/parameter_layout.h"

namespace megatrain::engine {

// Rows per vocabulary block of the LM head unless a run says otherwise: a
// Qwen-sized vocabulary (152k) in 19 blocks, each 8192 x d (bf16 on a GPU:
// 24 MiB at d = 1536).
inline constexpr int kDefaultHeadBlockRows = 8192;
// Tokens per LM-head chunk unless a run says otherwise. Each chunk's weight-gradient GEMM
// reads and rewrites its block's fp32 gradient, so few large chunks keep the head
// compute-bound on a GPU; the logits of one chunk and block take 2048 x 8192 elements.
inline constexpr int kDefaultHeadChunk = 2048;

struct ExecutorGeometry {
  ModelDims dims;
  ExecutorLayout layout;
  std::vector<size_t> entry_elements;  // padded floats of each layout entry
};

// head_chunk 0 = min(tokens, kDefaultHeadChunk); head_block_rows 0 = kDefaultHeadBlockRows
// (the LM head's vocabulary block, model_dims.h). INVALID_ARGUMENT for a micro_batch or seq
// below 1, naming the field.
absl::StatusOr<ExecutorGeometry> MakeExecutorGeometry(const ModelConfig& config,
                                                      const ParameterLayout& layout,
                                                      int micro_batch, int seq, int head_chunk,
                                                      int head_block_rows = 0);

// The pinned host bytes the executors of `devices` devices allocate beside the parameter
// store: StreamingExecutor::PinnedStagingBytes (gradient staging, host activation checkpoints,
// host copies of offloaded activation sets) with auto device_checkpoints resolved for an arena
// of `arena_capacity` bytes as Create resolves them, once per device. What the store's
// placement sets aside from the pinned budget (tiers::PlacementOptions::pinned_reserved): the
// trainer, the planner and the daemon's validation all ask this function.
uint64_t ExecutorPinnedStagingBytes(const ExecutorGeometry& geometry,
                                    const ExecutorOptions& options, size_t arena_capacity,
                                    DeviceKind kind, int devices);

}  // namespace megatrain::engine
