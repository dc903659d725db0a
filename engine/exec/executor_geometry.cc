// Executor shapes from a config and layout.
#include "engine/exec/executor_geometry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace megatrain::engine {
namespace {

int64_t OffsetOf(const ParameterLayout& layout, int entry, TensorRole role) {
  const TensorSlot* slot = layout.Find(entry, role);
  return slot == nullptr ? -1 : static_cast<int64_t>(slot->offset);
}

}  // namespace

absl::StatusOr<ExecutorGeometry> MakeExecutorGeometry(const ModelConfig& c,
                                                      const ParameterLayout& l, int micro_batch,
                                                      int seq, int head_chunk,
                                                      int head_block_rows) {
  if (micro_batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro_batch_size=", micro_batch, " must be >= 1"));
  }
  if (seq < 1) return absl::InvalidArgumentError(absl::StrCat("seq_len=", seq, " must be >= 1"));
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
  m.sliding_window = 0;  // ModelConfig::CheckSequenceLength keeps seq within any window
  m.tied_embeddings = c.tie_word_embeddings;
  m.qk_norm = c.qk_norm;
  m.batch = micro_batch;
  m.seq = seq;
  m.head_chunk = head_chunk > 0 ? head_chunk : std::min<int64_t>(m.tokens(), kDefaultHeadChunk);
  m.head_block_rows = head_block_rows > 0 ? head_block_rows : kDefaultHeadBlockRows;

  ScheduleShape& s = g.layout.schedule;
  s.num_layers = c.num_hidden_layers;
  s.embedding_entry = l.embedding_entry();
  s.first_layer_entry = l.layer_entry(0);
  s.final_norm_entry = l.final_norm_entry();
  s.lm_head_entry = l.tied_embeddings() ? l.embedding_entry() : l.lm_head_entry();
  LayerOffsets& o = g.layout.layer_offsets;
  const int e0 = l.layer_entry(0);
  o.input_norm = OffsetOf(l, e0, TensorRole::kInputNorm);
  o.q = OffsetOf(l, e0, TensorRole::kQ);
  o.q_bias = OffsetOf(l, e0, TensorRole::kQBias);
  o.q_norm = OffsetOf(l, e0, TensorRole::kQNorm);
  o.k = OffsetOf(l, e0, TensorRole::kK);
  o.k_bias = OffsetOf(l, e0, TensorRole::kKBias);
  o.k_norm = OffsetOf(l, e0, TensorRole::kKNorm);
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

uint64_t ExecutorPinnedStagingBytes(const ExecutorGeometry& geometry,
                                    const ExecutorOptions& options, size_t arena_capacity,
                                    DeviceKind kind, int devices) {
  // Create refuses these options naming the field; nothing to set aside for them.
  if (options.checkpoint_interval < 1 || geometry.dims.head_chunk < 1) return 0;
  // The checkpoint count depends on the arena, not on the pinned budget: resolve it first.
  ExecutorOptions resolved = options;
  resolved.device_checkpoints = StreamingExecutor::ChooseDeviceCheckpoints(
      geometry.dims, geometry.layout, geometry.entry_elements, options, arena_capacity, kind);
  const size_t per_device = StreamingExecutor::PinnedStagingBytes(
      geometry.dims, geometry.layout, geometry.entry_elements, resolved, kind);
  return static_cast<uint64_t>(per_device) * static_cast<uint64_t>(std::max(1, devices));
}

}  // namespace megatrain::engine
