// A StreamingExecutor over its own ParameterStore on a CPU device, every master filled from one
// deterministic sequence, for executor-level tests of tests/engine (RunMicroBatch called
// directly, the slabs read back).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/exec/executor_geometry.h"
#include "engine/exec/streaming_executor.h"
#include "engine/model/parameter_layout.h"
#include "kernels/cpu/rope.h"
#include "tests/engine/tiny_model.h"

namespace megatrain::engine::testing {

struct ExecutorRig {
  std::unique_ptr<CpuDevice> device;
  ExecutorGeometry geometry;
  std::unique_ptr<ParameterStore> store;
  std::unique_ptr<UpdateGate> gate;
  std::unique_ptr<kernels::cpu::RopeTable> rope;
  std::unique_ptr<StreamingExecutor> executor;
  int embedding_entry = 0;
};

// `placement` for the store (e.g. rows_gradient_entry), `options` for the executor; micro-batches
// of `micro_batch` sequences of `seq` tokens.
inline absl::StatusOr<ExecutorRig> MakeExecutorRig(const TinyShape& shape, int seq,
                                                  const StorePlacement& placement,
                                                  const ExecutorOptions& options,
                                                  int micro_batch = 1) {
  ExecutorRig rig;
  const ModelConfig config = TinyConfig(shape);
  absl::StatusOr<ParameterLayout> layout = ParameterLayout::Create(config);
  if (!layout.ok()) return layout.status();
  rig.embedding_entry = layout->embedding_entry();
  std::vector<EntrySpec> specs;
  for (const LayoutEntry& entry : layout->entries()) {
    EntrySpec spec;
    spec.elements = entry.num_elements;
    specs.push_back(spec);
  }
  absl::StatusOr<ExecutorGeometry> geometry =
      MakeExecutorGeometry(config, *layout, micro_batch, seq, /*head_chunk=*/0);
  if (!geometry.ok()) return geometry.status();
  rig.geometry = *geometry;
  rig.device = MakeCpuDevice(size_t{64} << 20);
  absl::StatusOr<ParameterStore> store = ParameterStore::Create(*rig.device, specs, placement);
  if (!store.ok()) return store.status();
  rig.store = std::make_unique<ParameterStore>(std::move(*store));
  uint64_t state = 17;
  for (int e = 0; e < rig.store->num_entries(); ++e) {
    const EntryBuffers b = rig.store->entry(e);
    for (size_t i = 0; i < b.elements; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      b.master[i] = (static_cast<float>((state >> 40) % 2001) - 1000.0f) * 1e-4f;
    }
  }
  rig.gate = std::make_unique<UpdateGate>(rig.store->num_entries());
  absl::StatusOr<kernels::cpu::RopeTable> rope = kernels::cpu::RopeTable::Create(
      seq, config.head_dim, config.rope_theta, config.KernelRopeScaling());
  if (!rope.ok()) return rope.status();
  rig.rope = std::make_unique<kernels::cpu::RopeTable>(std::move(*rope));
  absl::StatusOr<std::unique_ptr<StreamingExecutor>> executor =
      StreamingExecutor::Create(*rig.device, rig.geometry.dims, rig.geometry.layout, *rig.store,
                                *rig.gate, *rig.rope, options);
  if (!executor.ok()) return executor.status();
  rig.executor = std::move(*executor);
  return rig;
}

}  // namespace megatrain::engine::testing
