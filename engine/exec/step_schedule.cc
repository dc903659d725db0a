// Builds the per-micro-batch op schedule (see step_schedule.h).
#include "engine/exec/step_schedule.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace megatrain::engine {
namespace {

ScheduledOp EmbedOp(StageKind kind, int embedding_entry) {
  ScheduledOp op{kind, -1, false, false, -1, -1, {}, false};
  op.host_entry = embedding_entry;
  return op;
}

}  // namespace

const char* ActivationModeName(ActivationMode mode) {
  switch (mode) {
    case ActivationMode::kRecompute:
      return "recompute";
    case ActivationMode::kKeep:
      return "keep";
    case ActivationMode::kOffload:
      return "offload";
  }
  return "?";
}

int BlockCount(const ScheduleShape& s) {
  if (s.keep_all) return s.num_layers > 0 ? 1 : 0;
  return (s.num_layers + s.checkpoint_interval - 1) / s.checkpoint_interval;
}

ActivationMode BlockMode(const ScheduleShape& s, int block) {
  if (s.keep_all || block == BlockCount(s) - 1) return ActivationMode::kKeep;
  if (block < static_cast<int>(s.block_modes.size())) return s.block_modes[block];
  return ActivationMode::kRecompute;
}

int BlocksWithMode(const ScheduleShape& s, ActivationMode mode) {
  int count = 0;
  for (int b = 0; b + 1 < BlockCount(s); ++b) count += BlockMode(s, b) == mode ? 1 : 0;
  return count;
}

int ActivationSetCount(const ScheduleShape& s) {
  if (s.keep_all) return s.num_layers;
  return std::min(s.checkpoint_interval, s.num_layers) +
         s.checkpoint_interval * BlocksWithMode(s, ActivationMode::kKeep);
}

int CheckpointCount(const ScheduleShape& s) {
  if (s.keep_all) return 0;
  // Every block but the top one: the top block keeps its activations (BlockMode), so its input
  // is never written as a checkpoint nor read back.
  return (s.num_layers - 1) / s.checkpoint_interval;
}

namespace {

// The set an op writes or reads, counting the scratch set 0 of a forward that
// saves nothing; -1 for ops without one.
int SetTouched(const ScheduledOp& op) {
  if (op.kind == StageKind::kLayerForward) return op.save_activations ? op.activation_set : 0;
  if (op.kind == StageKind::kLayerBackward) return op.activation_set;
  return -1;
}

// Attaches each fetched backward's fetch to the last earlier op using its set.
void AttachFetches(std::vector<ScheduledOp>& ops) {
  for (size_t j = 0; j < ops.size(); ++j) {
    if (!ops[j].fetched_activations) continue;
    const int set = ops[j].activation_set;
    size_t last = j;
    while (last > 0 && SetTouched(ops[last - 1]) != set) --last;
    // The offloaded forward itself always touches the set.
    if (last == 0) std::abort();
    ops[last - 1].fetch_after.push_back({ops[j].layer, set});
  }
}

}  // namespace

std::vector<ScheduledOp> BuildStepSchedule(const ScheduleShape& s) {
  const int L = s.num_layers;
  const int k = s.checkpoint_interval;
  const int top_block_start = s.keep_all ? 0 : ((L - 1) / k) * k;
  auto layer_entry = [&](int i) { return s.first_layer_entry + i; };
  auto mode_of = [&](int i) { return BlockMode(s, s.keep_all ? 0 : i / k); };
  // Kept blocks below the top get sets of their own after the working sets.
  std::vector<int> keep_ordinal(static_cast<size_t>(BlockCount(s)), -1);
  for (int b = 0, next = 0; b + 1 < BlockCount(s); ++b) {
    if (BlockMode(s, b) == ActivationMode::kKeep) keep_ordinal[b] = next++;
  }
  auto set_of = [&](int i) {
    if (s.keep_all) return i;
    if (i < top_block_start && mode_of(i) == ActivationMode::kKeep) {
      return k + keep_ordinal[i / k] * k + i % k;
    }
    return i % k;
  };

  std::vector<ScheduledOp> ops;
  ops.push_back(EmbedOp(StageKind::kEmbedForward, s.embedding_entry));
  for (int i = 0; i < L; ++i) {
    ScheduledOp op{StageKind::kLayerForward, i, false, false, -1, -1, {layer_entry(i)}, false};
    const ActivationMode mode = mode_of(i);
    if (i >= top_block_start || mode != ActivationMode::kRecompute) {
      op.save_activations = true;
      op.activation_set = set_of(i);
    }
    if (i < top_block_start && mode == ActivationMode::kOffload) op.offload_activations = true;
    if (!s.keep_all && i % k == 0 && mode == ActivationMode::kRecompute) op.checkpoint = i / k;
    ops.push_back(op);
  }
  std::vector<int> head_entries = {s.final_norm_entry, s.lm_head_entry};
  ops.push_back({StageKind::kHead, -1, false, false, -1, -1, head_entries, true});

  for (int block_start = top_block_start; block_start >= 0;
       block_start -= (s.keep_all ? L + 1 : k)) {
    const int block_end = s.keep_all ? L : std::min(block_start + k, L);
    const ActivationMode mode = mode_of(block_start);
    if (block_start != top_block_start && mode == ActivationMode::kRecompute) {
      for (int i = block_start; i < block_end; ++i) {
        ScheduledOp op{StageKind::kLayerForward, i,    true, true, set_of(i), -1,
                       {layer_entry(i)},         false};
        if (i == block_start) op.checkpoint = i / k;  // reads its input from here
        ops.push_back(op);
      }
    }
    for (int i = block_end - 1; i >= block_start; --i) {
      ScheduledOp op{StageKind::kLayerBackward, i,   false, false, set_of(i), -1,
                     {layer_entry(i)},          true};
      op.fetched_activations = block_start != top_block_start && mode == ActivationMode::kOffload;
      ops.push_back(op);
    }
    if (s.keep_all) break;
  }
  ops.push_back(EmbedOp(StageKind::kEmbedBackward, s.embedding_entry));
  AttachFetches(ops);
  return ops;
}

std::vector<ScheduledOp> BuildEvalSchedule(const ScheduleShape& s) {
  std::vector<ScheduledOp> ops;
  ops.push_back(EmbedOp(StageKind::kEmbedForward, s.embedding_entry));
  for (int i = 0; i < s.num_layers; ++i) {
    ops.push_back(
        {StageKind::kLayerForward, i, false, false, -1, -1, {s.first_layer_entry + i}, false});
  }
  ScheduledOp head{
      StageKind::kHead, -1, false, false, -1, -1, {s.final_norm_entry, s.lm_head_entry}, false};
  head.loss_only = true;
  ops.push_back(head);
  return ops;
}

std::string DescribeOp(const ScheduledOp& op) {
  switch (op.kind) {
    case StageKind::kEmbedForward:
      return "embed.fwd";
    case StageKind::kLayerForward:
      return absl::StrCat(op.recompute ? "layer.recompute." : "layer.fwd.", op.layer);
    case StageKind::kHead:
      return "head";
    case StageKind::kLayerBackward:
      return absl::StrCat("layer.bwd.", op.layer);
    case StageKind::kEmbedBackward:
      return "embed.bwd";
  }
  return "?";
}

}  // namespace megatrain::engine
