// The compute side of the streaming executor for one kind of device: the
// element sizes of weights and activations on the device, the device memory a
// stage's math needs, the host side of the embedding stages, and the
// enqueueing of each stage's math on the compute stream. The executor keeps
// the schedule, the slots, the copies and the events; a backend only computes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/common/thread_pool.h"
#include "engine/device/device.h"
#include "engine/exec/fragment_parts.h"
#include "engine/exec/model_dims.h"
#include "engine/exec/parameter_store.h"
#include "kernels/cpu/rope.h"

namespace megatrain::engine {

// Device memory of a backend, known before any device exists (for planning).
struct StageSizes {
  size_t weight_element_bytes = 4;      // a weight slot holds the compute copy
  size_t activation_element_bytes = 4;  // residual stream, checkpoints, embedding rows
  size_t activation_set_bytes = 0;      // what one layer's backward reads
  size_t scratch_bytes = 0;             // backward, head, attention workspaces, tables
};

struct HeadResultSum {
  double loss_sum = 0.0;
  int64_t valid_tokens = 0;
};

// Pointers of one head stage or one of its parts. Gradient pointers and dx
// are null for the loss-only and logits forms.
struct HeadArgs {
  const void* final_norm = nullptr;
  // The whole head ([vocab, d]) when part is -1, else the rows of the part's
  // vocabulary block; lm_head_grad likewise (OVERWRITTEN, fp32).
  const void* lm_head = nullptr;
  const void* x_final = nullptr;
  const int32_t* targets = nullptr;       // device copy
  const int32_t* host_targets = nullptr;  // the same on the host, alive until the stage ran
  float inv_total_valid = 0.0f;
  void* dx_final = nullptr;          // OVERWRITTEN
  float* final_norm_grad = nullptr;  // OVERWRITTEN
  float* lm_head_grad = nullptr;
  // Zeroed before the stage writes its gradients (grad_floats floats; null =
  // nothing to zero): the padding between and after the entries' gradients
  // is copied out with them.
  float* gradient_buffer = nullptr;
  size_t grad_floats = 0;
  float* logits = nullptr;  // logits form: [tokens, vocab] fp32 on the device
  // -1 = the whole head; else one part, HeadStepAt(dims, part) (fragment
  // mode). The parts enqueued in order == the whole head, bit for bit.
  int part = -1;
};

// Per-tensor device pointers of one layer's weights (the backend's element type).
using LayerWeightPointers = LayerWeightsOf<void>;

class StageBackend {
 public:
  virtual ~StageBackend() = default;

  virtual const StageSizes& sizes() const = 0;

  // Carves the backend's buffers out of device memory the executor allocated:
  // `scratch` of sizes().scratch_bytes and one block of activation_set_bytes
  // per saved-activation set; `positions` and `segments` are the device copies of each token's
  // position and segment id, rewritten (on the copy stream) before each micro-batch's compute.
  // Setup copies (tables) go on `setup`.
  virtual absl::Status Bind(void* scratch, const std::vector<void*>& activation_sets,
                            const int32_t* positions, const int32_t* segments, Stream& setup) = 0;

  // The host array a slot is filled from: the compute copy of the entry.
  virtual const void* WeightSource(const EntryBuffers& entry) const = 0;

  // Host side of the embedding stages. rows: [tokens, hidden] in the
  // activation element type. Gather reads the compute copy; scatter adds into
  // the fp32 gradient slab (overwriting it on the first contribution).
  virtual void GatherEmbeddingRows(const EntryBuffers& table, const int32_t* ids,
                                   void* rows) const = 0;
  virtual void ScatterEmbeddingGradients(const void* d_rows, const int32_t* ids,
                                         bool first_contribution, float* grad) const = 0;

  // Enqueue one stage on the compute stream. The statuses report launch
  // failures; execution failures surface at the stream's Synchronize.
  // Layer forward: x_out = layer(x_in), saving into activation set `set`
  // (set 0 is scratch for a forward that saves nothing).
  virtual absl::Status LayerForward(Stream& compute, const void* weights, const void* x_in, int set,
                                    void* x_out, const TimelineTag& tag) = 0;
  // Layer backward from set `set`: zeroes `grads` (grad_floats floats), then
  // adds the layer's weight gradients into it.
  virtual absl::Status LayerBackward(Stream& compute, const void* weights, int set,
                                     const void* dx_out, void* dx_in, float* grads,
                                     size_t grad_floats, const TimelineTag& tag) = 0;
  // Fragment mode: one part of a layer stage (0..kLayerParts-1, see
  // fragment_parts.h), reading only the part's tensors through `weights`.
  // The parts enqueued in order == LayerForward / LayerBackward (backward
  // part 0 zeroes `grads`).
  virtual absl::Status LayerForwardPart(Stream& compute, int part,
                                        const LayerWeightPointers& weights, const void* x_in,
                                        int set, void* x_out, const TimelineTag& tag) = 0;
  virtual absl::Status LayerBackwardPart(Stream& compute, int part,
                                         const LayerWeightPointers& weights, int set,
                                         const void* dx_out, void* dx_in, float* grads,
                                         size_t grad_floats, const TimelineTag& tag) = 0;
  virtual absl::Status HeadForwardBackward(Stream& compute, const HeadArgs& args,
                                           const TimelineTag& tag) = 0;
  // sum[i] += g[i] for i < n, fp32 device memory: a step's gradients accumulated on the device
  // across its micro-batches (ExecutorOptions::gradient_accumulation). One IEEE add per element,
  // so the sums are bit for bit the host accumulation's.
  virtual absl::Status AccumulateGradients(Stream& compute, const float* g, size_t n, float* sum,
                                           const TimelineTag& tag) = 0;
  virtual absl::Status HeadLoss(Stream& compute, const HeadArgs& args, const TimelineTag& tag) = 0;
  virtual absl::Status HeadLogits(Stream& compute, const HeadArgs& args,
                                  const TimelineTag& tag) = 0;
  // The last head's loss sum and valid-token count; valid once the compute
  // stream has been synchronised after it.
  virtual HeadResultSum head_result() const = 0;
};

// Sizes of the CPU backend (fp32 everywhere).
StageSizes CpuStageSizes(const ModelDims& dims);

// The CPU device's backend over engine/exec/cpu_layer_math. `rope` and
// `pool` (may be null) must outlive it.
std::unique_ptr<StageBackend> MakeCpuStageBackend(const ModelDims& dims,
                                                  const LayerOffsets& offsets,
                                                  const kernels::cpu::RopeTable& rope,
                                                  ThreadPool* pool);

}  // namespace megatrain::engine
