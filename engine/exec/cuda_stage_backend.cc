// The CUDA device's StageBackend: each stage is enqueued on the compute
// stream's cudaStream_t through CudaLayerMath (bf16 storage, fp32 math and
// gradients). The heads' loss sums travel back per chunk into a pinned host
// array on the compute stream; the valid-token count is taken from the host
// targets at enqueue time, so nothing but the loss needs the device.
#include "engine/exec/cuda_stage_backend.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "engine/common/fatal.h"
#include "engine/common/parallel_chunks.h"
#include "engine/device/cuda_stream.h"
#include "engine/exec/cuda_activation_sets.h"
#include "engine/exec/cuda_layer_math.h"
#include "engine/exec/host_embedding.h"
#include "kernels/common/bf16.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/ops.h"

namespace megatrain::engine {
namespace {

using bf16 = __nv_bfloat16;

size_t Round256(size_t bytes) {
  return (bytes + kCudaCarveAlignment - 1) / kCudaCarveAlignment * kCudaCarveAlignment;
}

size_t ChunkLossBytes(const ModelDims& dims) {
  return static_cast<size_t>(HeadChunkCount(dims)) * sizeof(float);
}

// Prefixes a failed status with the stage it belongs to.
absl::Status InStage(absl::Status status, const TimelineTag& tag, const char* what) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat("CUDA stage '", tag.label, "' (", what,
                                                  "): ", std::string(status.message())));
}

absl::Status CudaCall(cudaError_t error, const TimelineTag& tag, const char* what) {
  return kernels::cuda::CudaStatus(error,
                                   absl::StrCat("CUDA stage '", tag.label, "' (", what, ")"));
}

// The cudaStream_t behind a Stream of the CUDA device.
absl::StatusOr<cudaStream_t> NativeStream(Stream& stream, const char* role) {
  auto* cuda = dynamic_cast<CudaStream*>(&stream);
  if (cuda == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("the CUDA stage backend's ", role, " stream '",
                                                   std::string(stream.name()),
                                                   "' is not a CUDA stream"));
  }
  return cuda->native_handle();
}

const bf16* Bf16(const void* p) { return static_cast<const bf16*>(p); }
bf16* Bf16(void* p) { return static_cast<bf16*>(p); }

int64_t CountValidTargets(const int32_t* host_targets, int64_t tokens) {
  int64_t valid = 0;
  for (int64_t t = 0; t < tokens; ++t) valid += host_targets[t] >= 0 ? 1 : 0;
  return valid;
}

class CudaStageBackend final : public StageBackend {
 public:
  CudaStageBackend(const ModelDims& dims, const LayerOffsets& offsets,
                   const kernels::cpu::RopeTable& rope, PinnedHostBuffer chunk_losses_host)
      : dims_(dims),
        offsets_(offsets),
        rope_(rope),
        sizes_(CudaStageSizes(dims)),
        plan_(PlanCudaScratch(dims)),
        chunk_losses_host_(std::move(chunk_losses_host)) {
    std::memset(chunk_losses_host_.data(), 0, chunk_losses_host_.size());
  }

  const StageSizes& sizes() const override { return sizes_; }

  // `positions` and `segments` are the executor's device copies, rewritten before every
  // micro-batch: RoPE reads the positions, attention the segment ids.
  absl::Status Bind(void* scratch, const std::vector<void*>& activation_sets,
                    const int32_t* positions, const int32_t* segments, Stream& setup) override {
    absl::StatusOr<cudaStream_t> setup_stream = NativeStream(setup, "setup");
    if (!setup_stream.ok()) return setup_stream.status();
    if (absl::Status s = CheckCarveBase(scratch, "scratch"); !s.ok()) return s;
    for (size_t i = 0; i < activation_sets.size(); ++i) {
      const std::string what = absl::StrCat("activation set ", i);
      if (absl::Status s = CheckCarveBase(activation_sets[i], what.c_str()); !s.ok()) return s;
    }
    char* base = static_cast<char*>(scratch);
    CudaLayerMathOptions math_options;
    math_options.positions = positions;
    math_options.segments = segments;
    absl::StatusOr<CudaLayerMath> math = CudaLayerMath::Create(
        dims_, offsets_, rope_, base + plan_.tables_offset, *setup_stream, math_options);
    if (!math.ok()) {
      return absl::Status(math.status().code(), absl::StrCat("CUDA stage backend Bind: ",
                                                             std::string(math.status().message())));
    }
    math_.emplace(std::move(*math));
    backward_scratch_ = CudaBackwardScratch::Carve(dims_, base + plan_.backward_offset);
    head_scratch_ = CudaHeadScratch::Carve(dims_, base + plan_.head_offset);
    chunk_losses_device_ = reinterpret_cast<float*>(base + plan_.chunk_losses_offset);
    sets_.clear();
    for (void* set : activation_sets) sets_.push_back(CudaActivations::Carve(dims_, set));
    return absl::OkStatus();
  }

  const void* WeightSource(const EntryBuffers& entry) const override {
    if (entry.compute_bf16 == nullptr) {
      internal::DieBecause(
          "CUDA stage backend: a parameter entry has no bf16 compute copy (the store must be "
          "created with StorePlacement::compute_copy_bf16 on a CUDA device)");
    }
    return entry.compute_bf16;
  }

  // Ids were validated against the vocabulary by the executor. 117 MB at 16k tokens of
  // Qwen2.5-7B took 19 ms on one thread before every micro-batch's first layer (H200 trace,
  // 2026-11-28): large gathers copy disjoint token ranges on host threads (same bytes).
  void GatherEmbeddingRows(const EntryBuffers& table, const int32_t* ids,
                           void* rows) const override {
    const uint16_t* source = static_cast<const uint16_t*>(WeightSource(table));
    uint16_t* out = static_cast<uint16_t*>(rows);
    const int64_t hidden = dims_.hidden;
    const size_t row_bytes = static_cast<size_t>(hidden) * sizeof(uint16_t);
    const size_t tokens = static_cast<size_t>(dims_.tokens());
    const unsigned threads = tokens * static_cast<size_t>(hidden) >= (size_t{1} << 22)
                                 ? HostChunkThreads()
                                 : 1;
    RunInChunksOnThreads(tokens, threads, 64, [&](size_t begin, size_t end) {
      for (size_t t = begin; t < end; ++t) {
        std::memcpy(out + t * hidden, source + int64_t{ids[t]} * hidden, row_bytes);
      }
    });
  }

  // The bf16 rows are widened as they are summed (the same bits as widening them first; 41 ms a
  // micro-batch of 16k tokens of Qwen2.5-7B with the separate pass on the H200, 2026-11-28).
  void ScatterEmbeddingGradients(const void* d_rows, const int32_t* ids, bool first_contribution,
                                 float* grad) const override {
    ScatterAddEmbeddingRowsBf16(static_cast<const uint16_t*>(d_rows), ids, dims_.tokens(),
                                dims_.vocab, dims_.hidden, first_contribution, grad);
  }

  absl::Status LayerForward(Stream& compute, const void* weights, const void* x_in, int set,
                            void* x_out, const TimelineTag& tag) override {
    absl::StatusOr<cudaStream_t> stream = ComputeStream(compute, tag);
    if (!stream.ok()) return stream.status();
    if (absl::Status s = CheckSet(set, tag); !s.ok()) return s;
    return Timed(compute, tag, [&](cudaStream_t on) {
      return InStage(math_->LayerForward(Bf16(weights), Bf16(x_in), sets_[set], Bf16(x_out), on),
                     tag, "layer forward");
    });
  }

  absl::Status LayerBackward(Stream& compute, const void* weights, int set, const void* dx_out,
                             void* dx_in, float* grads, size_t grad_floats,
                             const TimelineTag& tag) override {
    absl::StatusOr<cudaStream_t> stream = ComputeStream(compute, tag);
    if (!stream.ok()) return stream.status();
    if (absl::Status s = CheckSet(set, tag); !s.ok()) return s;
    return Timed(compute, tag, [&](cudaStream_t on) {
      if (absl::Status s = CudaCall(cudaMemsetAsync(grads, 0, grad_floats * sizeof(float), on), tag,
                                    "zero the gradient buffer");
          !s.ok()) {
        return s;
      }
      return InStage(math_->LayerBackward(Bf16(weights), sets_[set], backward_scratch_,
                                          Bf16(dx_out), Bf16(dx_in), grads, on),
                     tag, "layer backward");
    });
  }

  absl::Status AccumulateGradients(Stream& compute, const float* g, size_t n, float* sum,
                                   const TimelineTag& tag) override {
    absl::StatusOr<cudaStream_t> stream = ComputeStream(compute, tag);
    if (!stream.ok()) return stream.status();
    return Timed(compute, tag, [&](cudaStream_t on) {
      return InStage(kernels::cuda::AccumulateFp32(g, sum, static_cast<int64_t>(n), on), tag,
                     "accumulate gradients");
    });
  }

  absl::Status LayerForwardPart(Stream& compute, int part, const LayerWeightPointers& weights,
                                const void* x_in, int set, void* x_out,
                                const TimelineTag& tag) override {
    absl::StatusOr<cudaStream_t> stream = ComputeStream(compute, tag);
    if (!stream.ok()) return stream.status();
    if (absl::Status s = CheckSet(set, tag); !s.ok()) return s;
    return Timed(compute, tag, [&](cudaStream_t on) {
      return InStage(math_->LayerForwardPart(part, LayerWeightsAs<bf16>(weights), Bf16(x_in),
                                             sets_[set], Bf16(x_out), on),
                     tag, "layer forward part");
    });
  }

  absl::Status LayerBackwardPart(Stream& compute, int part, const LayerWeightPointers& weights,
                                 int set, const void* dx_out, void* dx_in, float* grads,
                                 size_t grad_floats, const TimelineTag& tag) override {
    absl::StatusOr<cudaStream_t> stream = ComputeStream(compute, tag);
    if (!stream.ok()) return stream.status();
    if (absl::Status s = CheckSet(set, tag); !s.ok()) return s;
    return Timed(compute, tag, [&](cudaStream_t on) {
      if (part == 0) {
        if (absl::Status s = CudaCall(cudaMemsetAsync(grads, 0, grad_floats * sizeof(float), on),
                                      tag, "zero the gradient buffer");
            !s.ok()) {
          return s;
        }
      }
      return InStage(
          math_->LayerBackwardPart(part, LayerWeightsAs<bf16>(weights), sets_[set],
                                   backward_scratch_, Bf16(dx_out), Bf16(dx_in), grads, on),
          tag, "layer backward part");
    });
  }

  absl::Status HeadForwardBackward(Stream& compute, const HeadArgs& args,
                                   const TimelineTag& tag) override {
    return EnqueueHead(compute, HeadForm::kTrain, args, tag);
  }

  absl::Status HeadLoss(Stream& compute, const HeadArgs& args, const TimelineTag& tag) override {
    return EnqueueHead(compute, HeadForm::kLoss, args, tag);
  }

  absl::Status HeadLogits(Stream& compute, const HeadArgs& args, const TimelineTag& tag) override {
    return EnqueueHead(compute, HeadForm::kLogits, args, tag);
  }

  HeadResultSum head_result() const override {
    const std::span<const float> chunks(chunk_losses_host_.data_as<const float>(),
                                        static_cast<size_t>(HeadChunkCount(dims_)));
    return HeadResultSum{CudaLayerMath::SumChunkLosses(chunks), valid_tokens_};
  }

 private:
  static absl::Status CheckCarveBase(const void* base, const char* what) {
    if (base == nullptr || reinterpret_cast<uintptr_t>(base) % kCudaCarveAlignment != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA stage backend Bind: ", what, " at ", absl::Hex(reinterpret_cast<uintptr_t>(base)),
          " is null or not ", kCudaCarveAlignment, "-byte aligned"));
    }
    return absl::OkStatus();
  }

  // The compute stream's handle, once Bind has created the math.
  absl::StatusOr<cudaStream_t> ComputeStream(Stream& compute, const TimelineTag& tag) const {
    if (!math_.has_value()) {
      return absl::FailedPreconditionError(
          absl::StrCat("CUDA stage '", tag.label, "' enqueued before Bind"));
    }
    return NativeStream(compute, "compute");
  }

  // Enqueues `body` on the compute stream (a CudaStream, checked by
  // ComputeStream) as one timeline span with `tag`: the per-layer compute
  // times of the step report and the activation policy's measurements.
  static absl::Status Timed(Stream& compute, const TimelineTag& tag,
                            absl::FunctionRef<absl::Status(cudaStream_t)> body) {
    return static_cast<CudaStream&>(compute).EnqueueTimed(tag, body);
  }

  absl::Status CheckSet(int set, const TimelineTag& tag) const {
    if (set < 0 || static_cast<size_t>(set) >= sets_.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("CUDA stage '", tag.label, "': activation set ", set, " of ", sets_.size()));
    }
    return absl::OkStatus();
  }

  // The whole head (part -1) or one of its parts; the loss follows the last
  // forward block to the host.
  absl::Status EnqueueHead(Stream& compute, HeadForm form, const HeadArgs& args,
                           const TimelineTag& tag) {
    absl::StatusOr<cudaStream_t> stream = ComputeStream(compute, tag);
    if (!stream.ok()) return stream.status();
    if (form != HeadForm::kLogits) {
      if (absl::Status s = CheckHostTargets(args, tag); !s.ok()) return s;
    }
    CudaLayerMath::HeadPointers p;
    p.form = form;
    p.final_norm = Bf16(args.final_norm);
    p.x_final = Bf16(args.x_final);
    p.targets = args.targets;
    p.inv_total_valid = args.inv_total_valid;
    p.dx_final = Bf16(args.dx_final);
    p.final_norm_grad = args.final_norm_grad;
    p.logits = args.logits;
    p.chunk_loss_sums = chunk_losses_device_;
    return Timed(compute, tag,
                 [&](cudaStream_t on) { return EnqueueHeadOn(form, args, p, tag, on); });
  }

  // The head's launches on the compute stream `on`, inside its timeline span.
  absl::Status EnqueueHeadOn(HeadForm form, const HeadArgs& args, CudaLayerMath::HeadPointers& p,
                             const TimelineTag& tag, cudaStream_t on) {
    if (args.gradient_buffer != nullptr) {
      if (absl::Status s = CudaCall(
              cudaMemsetAsync(args.gradient_buffer, 0, args.grad_floats * sizeof(float), on), tag,
              "zero the gradient buffer");
          !s.ok()) {
        return s;
      }
    }
    absl::Status launched;
    bool loss_ready = form != HeadForm::kLogits;
    if (args.part < 0) {
      launched = math_->Head(p, Bf16(args.lm_head), args.lm_head_grad, head_scratch_, on);
    } else {
      const HeadStep step = HeadStepAt(dims_, args.part);
      p.lm_block = Bf16(args.lm_head);
      p.lm_block_grad = args.lm_head_grad;
      launched = math_->HeadStep(step, p, head_scratch_, on);
      loss_ready = loss_ready && step.kind == HeadStepKind::kForwardBlock &&
                   step.block + 1 == HeadBlockCount(dims_);
    }
    if (absl::Status s = InStage(launched, tag, "head"); !s.ok()) return s;
    return loss_ready ? DownloadLoss(args, on, tag) : absl::OkStatus();
  }

  // The valid tokens are counted on the host; without its targets the head cannot report them.
  static absl::Status CheckHostTargets(const HeadArgs& args, const TimelineTag& tag) {
    if (args.host_targets == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("CUDA stage '", tag.label, "': HeadArgs.host_targets is null"));
    }
    return absl::OkStatus();
  }

  // The chunk sums follow the head on its stream into the pinned array
  // head_result() reads after the executor synchronised that stream.
  absl::Status DownloadLoss(const HeadArgs& args, cudaStream_t stream, const TimelineTag& tag) {
    if (absl::Status s =
            CudaCall(cudaMemcpyAsync(chunk_losses_host_.data(), chunk_losses_device_,
                                     ChunkLossBytes(dims_), cudaMemcpyDeviceToHost, stream),
                     tag, "download the chunk losses");
        !s.ok()) {
      return s;
    }
    valid_tokens_ = CountValidTargets(args.host_targets, dims_.tokens());
    return absl::OkStatus();
  }

  const ModelDims dims_;
  const LayerOffsets offsets_;
  const kernels::cpu::RopeTable& rope_;
  const StageSizes sizes_;
  const CudaScratchPlan plan_;
  PinnedHostBuffer chunk_losses_host_;  // fp32 [HeadChunkCount]
  std::optional<CudaLayerMath> math_;  // created by Bind
  std::vector<CudaActivations> sets_;
  CudaBackwardScratch backward_scratch_;
  CudaHeadScratch head_scratch_;
  float* chunk_losses_device_ = nullptr;
  int64_t valid_tokens_ = 0;  // of the last loss-producing head
};

}  // namespace

CudaScratchPlan PlanCudaScratch(const ModelDims& dims) {
  CudaScratchPlan plan;
  size_t at = 0;
  plan.backward_offset = at;
  at += Round256(CudaBackwardScratch::Bytes(dims));
  plan.head_offset = at;
  at += Round256(CudaHeadScratch::Bytes(dims));
  plan.tables_offset = at;
  at += Round256(CudaLayerMath::TablesBytes(dims));
  plan.chunk_losses_offset = at;
  at += Round256(ChunkLossBytes(dims));
  plan.total_bytes = at;
  return plan;
}

StageSizes CudaStageSizes(const ModelDims& dims) {
  StageSizes s;
  s.weight_element_bytes = sizeof(uint16_t);
  s.activation_element_bytes = sizeof(uint16_t);
  s.activation_set_bytes = CudaActivations::Bytes(dims);
  s.scratch_bytes = PlanCudaScratch(dims).total_bytes;
  return s;
}

size_t CudaStageBackendPinnedBytes(const ModelDims& dims) { return ChunkLossBytes(dims); }

absl::StatusOr<std::unique_ptr<StageBackend>> MakeCudaStageBackend(
    Device& device, const ModelDims& dims, const LayerOffsets& offsets,
    const kernels::cpu::RopeTable& rope) {
  if (absl::Status s = CudaLayerMath::Validate(dims, offsets, rope); !s.ok()) return s;
  absl::StatusOr<PinnedHostBuffer> chunk_losses =
      device.AllocatePinned(CudaStageBackendPinnedBytes(dims));
  if (!chunk_losses.ok()) {
    return absl::Status(chunk_losses.status().code(),
                        absl::StrCat("CUDA stage backend chunk losses: ",
                                     std::string(chunk_losses.status().message())));
  }
  return std::make_unique<CudaStageBackend>(dims, offsets, rope, std::move(*chunk_losses));
}

}  // namespace megatrain::engine
