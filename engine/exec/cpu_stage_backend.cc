// The CPU device's StageBackend: every stage is a host task on the compute
// stream's worker thread running engine/exec/cpu_layer_math (fp32 throughout;
// the fp32 master is the compute copy).
#include <algorithm>
#include <cstring>
#include <optional>

#include "engine/exec/activation_sets.h"
#include "engine/exec/cpu_layer_math.h"
#include "engine/exec/host_embedding.h"
#include "engine/exec/stage_backend.h"
#include "kernels/cpu/residual.h"

namespace megatrain::engine {
namespace {

size_t Round256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Elements of one task of the gradient sums' add.
constexpr size_t kChunk = size_t{1} << 16;

class CpuStageBackend final : public StageBackend {
 public:
  CpuStageBackend(const ModelDims& dims, const LayerOffsets& offsets,
                  const kernels::cpu::RopeTable& rope, ThreadPool* pool)
      : dims_(dims), offsets_(offsets), rope_(rope), pool_(pool), sizes_(CpuStageSizes(dims)) {}

  const StageSizes& sizes() const override { return sizes_; }

  absl::Status Bind(void* scratch, const std::vector<void*>& activation_sets,
                    const int32_t* positions, const int32_t* segments,
                    Stream& /*setup*/) override {
    char* base = static_cast<char*>(scratch);
    backward_scratch_ = LayerBackwardScratch::Carve(dims_, base);
    base += Round256(LayerBackwardScratch::Bytes(dims_));
    head_scratch_ = HeadScratch::Carve(dims_, base);
    base += Round256(HeadScratch::Bytes(dims_));
    attention_workspace_ = reinterpret_cast<float*>(base);
    sets_.clear();
    for (void* set : activation_sets) {
      sets_.push_back(LayerActivations::Carve(dims_, set));
    }
    positions_ = positions;
    segments_ = segments;
    return absl::OkStatus();
  }

  const void* WeightSource(const EntryBuffers& entry) const override {
    return entry.fp32_weights();
  }

  void GatherEmbeddingRows(const EntryBuffers& table, const int32_t* ids,
                           void* rows) const override {
    engine::GatherEmbeddingRows(table.fp32_weights(), dims_.vocab, dims_.hidden, ids,
                                dims_.tokens(), static_cast<float*>(rows));
  }

  void ScatterEmbeddingGradients(const void* d_rows, const int32_t* ids, bool first_contribution,
                                 float* grad) const override {
    ScatterAddEmbeddingRows(static_cast<const float*>(d_rows), ids, dims_.tokens(), dims_.vocab,
                            dims_.hidden, first_contribution, grad);
  }

  absl::Status LayerForward(Stream& compute, const void* weights, const void* x_in, int set,
                            void* x_out, const TimelineTag& tag) override {
    const LayerContext ctx = Context();
    const float* w = static_cast<const float*>(weights);
    const float* in = static_cast<const float*>(x_in);
    float* out = static_cast<float*>(x_out);
    LayerActivations* act = &sets_[set];
    compute.EnqueueHostTask([ctx, w, in, act, out] { CpuLayerForward(ctx, w, in, *act, out); },
                            tag);
    return absl::OkStatus();
  }

  absl::Status LayerBackward(Stream& compute, const void* weights, int set, const void* dx_out,
                             void* dx_in, float* grads, size_t grad_floats,
                             const TimelineTag& tag) override {
    const LayerContext ctx = Context();
    const float* w = static_cast<const float*>(weights);
    const LayerActivations* act = &sets_[set];
    LayerBackwardScratch* scratch = &backward_scratch_;
    const float* d_out = static_cast<const float*>(dx_out);
    float* d_in = static_cast<float*>(dx_in);
    compute.EnqueueHostTask(
        [ctx, w, grads, grad_floats, act, scratch, d_out, d_in] {
          std::memset(grads, 0, grad_floats * sizeof(float));
          CpuLayerBackward(ctx, w, *act, *scratch, d_out, d_in, grads);
        },
        tag);
    return absl::OkStatus();
  }

  absl::Status LayerForwardPart(Stream& compute, int part, const LayerWeightPointers& weights,
                                const void* x_in, int set, void* x_out,
                                const TimelineTag& tag) override {
    const LayerContext ctx = Context();
    const LayerWeights w = LayerWeightsAs<float>(weights);
    const float* in = static_cast<const float*>(x_in);
    float* out = static_cast<float*>(x_out);
    LayerActivations* act = &sets_[set];
    compute.EnqueueHostTask(
        [ctx, part, w, in, act, out] { CpuLayerForwardPart(ctx, part, w, in, *act, out); }, tag);
    return absl::OkStatus();
  }

  absl::Status LayerBackwardPart(Stream& compute, int part, const LayerWeightPointers& weights,
                                 int set, const void* dx_out, void* dx_in, float* grads,
                                 size_t grad_floats, const TimelineTag& tag) override {
    const LayerContext ctx = Context();
    const LayerWeights w = LayerWeightsAs<float>(weights);
    const LayerActivations* act = &sets_[set];
    LayerBackwardScratch* scratch = &backward_scratch_;
    const float* d_out = static_cast<const float*>(dx_out);
    float* d_in = static_cast<float*>(dx_in);
    compute.EnqueueHostTask(
        [ctx, part, w, grads, grad_floats, act, scratch, d_out, d_in] {
          if (part == 0) std::memset(grads, 0, grad_floats * sizeof(float));
          CpuLayerBackwardPart(ctx, part, w, *act, *scratch, d_out, d_in, grads);
        },
        tag);
    return absl::OkStatus();
  }

  absl::Status AccumulateGradients(Stream& compute, const float* g, size_t n, float* sum,
                                   const TimelineTag& tag) override {
    ThreadPool* pool = pool_;
    compute.EnqueueHostTask(
        [pool, g, n, sum] {
          // Element-wise: any split gives the same bits.
          const size_t chunks = (n + kChunk - 1) / kChunk;
          auto add = [g, n, sum](size_t c) {
            const size_t first = c * kChunk;
            kernels::cpu::ResidualAdd(g + first, static_cast<int64_t>(std::min(kChunk, n - first)),
                                      sum + first);
          };
          if (pool == nullptr || chunks < 2) {
            for (size_t c = 0; c < chunks; ++c) add(c);
          } else {
            pool->ParallelFor(chunks, add);
          }
        },
        tag);
    return absl::OkStatus();
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

  HeadResultSum head_result() const override { return head_result_; }

 private:
  static const float* Floats(const void* p) { return static_cast<const float*>(p); }

  absl::Status EnqueueHead(Stream& compute, HeadForm form, const HeadArgs& args,
                           const TimelineTag& tag) {
    CpuStageBackend* self = this;
    compute.EnqueueHostTask(
        [self, form, args] {
          CpuHeadArgs a;
          a.form = form;
          a.final_norm = Floats(args.final_norm);
          a.x_final = Floats(args.x_final);
          a.targets = args.targets;
          a.inv_total_valid = args.inv_total_valid;
          a.dx_final = static_cast<float*>(args.dx_final);
          a.final_norm_grad = args.final_norm_grad;
          a.logits = args.logits;
          if (args.gradient_buffer != nullptr) {
            std::memset(args.gradient_buffer, 0, args.grad_floats * sizeof(float));
          }
          std::optional<HeadResult> r;
          if (args.part < 0) {
            r = CpuHead(self->dims_, a, Floats(args.lm_head), args.lm_head_grad,
                        self->head_scratch_);
          } else {
            a.lm_block = Floats(args.lm_head);
            a.lm_block_grad = args.lm_head_grad;
            r = CpuHeadStep(self->dims_, HeadStepAt(self->dims_, args.part), a,
                            self->head_scratch_);
          }
          if (r.has_value() && form != HeadForm::kLogits) {
            self->head_result_ = {r->loss_sum, r->valid_tokens};
          }
        },
        tag);
    return absl::OkStatus();
  }

  LayerContext Context() const {
    return LayerContext{&dims_,     &offsets_,           &rope_, positions_,
                        attention_workspace_, pool_, segments_};
  }

  const ModelDims dims_;
  const LayerOffsets offsets_;
  const kernels::cpu::RopeTable& rope_;
  ThreadPool* const pool_;
  const StageSizes sizes_;
  std::vector<LayerActivations> sets_;
  LayerBackwardScratch backward_scratch_;
  HeadScratch head_scratch_;
  float* attention_workspace_ = nullptr;
  const int32_t* positions_ = nullptr;
  const int32_t* segments_ = nullptr;
  HeadResultSum head_result_;  // written by the head's task on the compute thread
};

}  // namespace

StageSizes CpuStageSizes(const ModelDims& dims) {
  StageSizes s;
  s.weight_element_bytes = sizeof(float);
  s.activation_element_bytes = sizeof(float);
  s.activation_set_bytes = LayerActivations::Bytes(dims);
  s.scratch_bytes = Round256(LayerBackwardScratch::Bytes(dims)) +
                    Round256(HeadScratch::Bytes(dims)) +
                    Round256(AttentionWorkspaceFloats(dims) * sizeof(float));
  return s;
}

std::unique_ptr<StageBackend> MakeCpuStageBackend(const ModelDims& dims,
                                                  const LayerOffsets& offsets,
                                                  const kernels::cpu::RopeTable& rope,
                                                  ThreadPool* pool) {
  return std::make_unique<CpuStageBackend>(dims, offsets, rope, pool);
}

}  // namespace megatrain::engine
