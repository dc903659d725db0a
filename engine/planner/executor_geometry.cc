// Executor shapes from a config, and the device plan from entry sizes.
#include "engine/planner/executor_geometry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/exec/activation_sets.h"
#include "engine/exec/cpu_layer_math.h"
#include "engine/exec/weight_slot_policy.h"

namespace megatrain::engine::planner {
namespace {

constexpr size_t kEntryAlignFloats = 64;  // the executor packs stage entries at this alignment

size_t AlignFloats(size_t n) {
  return (n + kEntryAlignFloats - 1) / kEntryAlignFloats * kEntryAlignFloats;
}
size_t Round256(size_t bytes) { return (bytes + 255) / 256 * 256; }

int64_t OffsetOf(const ParameterLayout& layout, int entry, TensorRole role) {
  const TensorSlot* slot = layout.Find(entry, role);
  return slot == nullptr ? -1 : static_cast<int64_t>(slot->offset);
}

ScheduleShape ShapeWith(const ExecutorGeometry& g, const ExecutorOptions& options) {
  ScheduleShape s = g.layout.schedule;
  s.checkpoint_interval = options.checkpoint_interval;
  s.keep_all = options.keep_all;
  return s;
}

}  // namespace

size_t StageFloats(const ExecutorGeometry& g, const std::vector<int>& entries) {
  size_t used = 0;
  for (int e : entries) used += AlignFloats(g.entry_elements[e]);
  return used;
}

absl::StatusOr<ExecutorGeometry> MakeExecutorGeometry(const ModelConfig& c,
                                                      const ParameterLayout& l, int micro_batch,
                                                      int seq, int head_chunk,
                                                      const ExecutorOptions& options) {
  if (micro_batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("micro_batch=", micro_batch, " must be >= 1"));
  }
  if (seq < 1) return absl::InvalidArgumentError(absl::StrCat("seq=", seq, " must be >= 1"));
  if (options.checkpoint_interval < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint_interval=", options.checkpoint_interval, " must be >= 1"));
  }
  ExecutorGeometry g;
  ModelDims& m = g.dims;
  m.vocab = c.vocab_size;
  m.hidden = c.hidden_size;
  m.ffn = c.intermediate_size;
  m.q_heads = c.num_attention_heads;
  m.kv_heads = c.num_key_value_heads;
  m.head_dim = c.head_dim;
  m.num_layers = c.num_hidden_layers;
  m.rms_eps = static_cast<float>(c.rms_norm_eps);
  m.tied_embeddings = c.tie_word_embeddings;
  m.batch = micro_batch;
  m.seq = seq;
  m.head_chunk = head_chunk > 0 ? head_chunk : std::min<int64_t>(m.tokens(), 256);
  ScheduleShape& s = g.layout.schedule;
  s.num_layers = c.num_hidden_layers;
  s.checkpoint_interval = options.checkpoint_interval;
  s.keep_all = options.keep_all;
  s.embedding_entry = l.embedding_entry();
  s.first_layer_entry = l.layer_entry(0);
  s.final_norm_entry = l.final_norm_entry();
  s.lm_head_entry = l.tied_embeddings() ? l.embedding_entry() : l.lm_head_entry();
  LayerOffsets& o = g.layout.layer_offsets;
  const int e0 = l.layer_entry(0);
  o.input_norm = OffsetOf(l, e0, TensorRole::kInputNorm);
  o.q = OffsetOf(l, e0, TensorRole::kQ);
  o.q_bias = OffsetOf(l, e0, TensorRole::kQBias);
  o.k = OffsetOf(l, e0, TensorRole::kK);
  o.k_bias = OffsetOf(l, e0, TensorRole::kKBias);
  o.v = OffsetOf(l, e0, TensorRole::kV);
  o.v_bias = OffsetOf(l, e0, TensorRole::kVBias);
  o.o = OffsetOf(l, e0, TensorRole::kO);
  o.o_bias = OffsetOf(l, e0, TensorRole::kOBias);
  o.post_norm = OffsetOf(l, e0, TensorRole::kPostAttentionNorm);
  o.gate = OffsetOf(l, e0, TensorRole::kGate);
  o.gate_bias = OffsetOf(l, e0, TensorRole::kGateBias);
  o.up = OffsetOf(l, e0, TensorRole::kUp);
  o.up_bias = OffsetOf(l, e0, TensorRole::kUpBias);
  o.down = OffsetOf(l, e0, TensorRole::kDown);
  o.down_bias = OffsetOf(l, e0, TensorRole::kDownBias);
  for (const LayoutEntry& e : l.entries()) g.entry_elements.push_back(e.num_elements);
  return g;
}

DeviceMemoryPlan DeviceMemoryPlanFor(const ExecutorGeometry& g, const ExecutorOptions& options,
                                     int weight_slots) {
  const ScheduleShape shape = ShapeWith(g, options);
  size_t slot_floats = 0, grad_floats = 0;
  for (const ScheduledOp& op : BuildStepSchedule(shape)) {
    const size_t floats = StageFloats(g, op.entries);
    slot_floats = std::max(slot_floats, floats);
    if (op.produces_gradients) grad_floats = std::max(grad_floats, floats);
  }
  const int checkpoints = CheckpointCount(shape);
  const int device_checkpoints = options.device_checkpoints < 0
                                     ? checkpoints
                                     : std::min(options.device_checkpoints, checkpoints);
  const ModelDims& dims = g.dims;
  const size_t n = static_cast<size_t>(dims.tokens());
  const size_t x_bytes = Round256(n * dims.hidden * sizeof(float));
  DeviceMemoryPlan plan;
  plan.weight_slots = weight_slots * Round256(slot_floats * sizeof(float));
  plan.gradient_buffers = 2 * Round256(grad_floats * sizeof(float));
  plan.activations =
      ActivationSetCount(shape) * Round256(LayerActivations::FloatCount(dims) * sizeof(float));
  plan.checkpoints = device_checkpoints * x_bytes;
  plan.scratch = 4 * x_bytes + Round256(LayerBackwardScratch::FloatCount(dims) * sizeof(float)) +
                 Round256(HeadScratch::FloatCount(dims) * sizeof(float)) +
                 Round256(AttentionWorkspaceFloats(dims) * sizeof(float)) +
                 3 * Round256(n * sizeof(int32_t));
  if (device_checkpoints < checkpoints) plan.scratch += x_bytes;
  return plan;
}

int WeightSlotsFor(const ExecutorGeometry& g, const ExecutorOptions& options, size_t arena_bytes) {
  if (options.weight_slots != 0) return options.weight_slots;
  const ScheduleShape shape = ShapeWith(g, options);
  std::vector<std::vector<int>> stages;
  size_t slot_floats = 0;
  for (const ScheduledOp& op : BuildStepSchedule(shape)) {
    stages.push_back(op.entries);
    slot_floats = std::max(slot_floats, StageFloats(g, op.entries));
  }
  const int max_slots = std::max(2, DistinctStageCount(stages));
  const size_t base = DeviceMemoryPlanFor(g, options, 2).total();
  const size_t slot_bytes = Round256(slot_floats * sizeof(float));
  const size_t spare = arena_bytes > base ? arena_bytes - base : 0;
  const size_t usable = spare > arena_bytes / 16 ? spare - arena_bytes / 16 : 0;
  return std::min<int>(max_slots, 2 + static_cast<int>(usable / std::max<size_t>(slot_bytes, 1)));
}

}  // namespace megatrain::engine::planner
