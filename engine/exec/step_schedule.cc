// Builds the per-micro-batch op schedule (see step_schedule.h).
#include "engine/exec/step_schedule.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace megatrain::engine {
namespace {

ScheduledOp EmbedOp(StageKind kind, int embedding_entry) {
  ScheduledOp op{kind, -1, false, false, -1, -1, {}, false};
  op.host_entry = embedding_entry;
  return op;
}

}  // namespace

int ActivationSetCount(const ScheduleShape& s) {
  return s.keep_all ? s.num_layers : std::min(s.checkpoint_interval, s.num_layers);
}

int CheckpointCount(const ScheduleShape& s) {
  if (s.keep_all) return 0;
  return (s.num_layers + s.checkpoint_interval - 1) / s.checkpoint_interval;
}

std::vector<ScheduledOp> BuildStepSchedule(const ScheduleShape& s) {
  const int L = s.num_layers;
  const int k = s.checkpoint_interval;
  const int top_block_start = s.keep_all ? 0 : ((L - 1) / k) * k;
  auto layer_entry = [&](int i) { return s.first_layer_entry + i; };
  auto set_of = [&](int i) { return s.keep_all ? i : i % k; };

  std::vector<ScheduledOp> ops;
  ops.push_back(EmbedOp(StageKind::kEmbedForward, s.embedding_entry));
  for (int i = 0; i < L; ++i) {
    ScheduledOp op{StageKind::kLayerForward, i, false, false, -1, -1, {layer_entry(i)}, false};
    if (i >= top_block_start) {
      op.save_activations = true;
      op.activation_set = set_of(i);
    }
    if (!s.keep_all && i % k == 0) op.checkpoint = i / k;
    ops.push_back(op);
  }
  std::vector<int> head_entries = {s.final_norm_entry, s.lm_head_entry};
  ops.push_back({StageKind::kHead, -1, false, false, -1, -1, head_entries, true});

  for (int block_start = top_block_start; block_start >= 0;
       block_start -= (s.keep_all ? L + 1 : k)) {
    const int block_end = s.keep_all ? L : std::min(block_start + k, L);
    if (block_start != top_block_start) {
      for (int i = block_start; i < block_end; ++i) {
        ScheduledOp op{StageKind::kLayerForward, i,    true, true, set_of(i), -1,
                       {layer_entry(i)},         false};
        if (i == block_start) op.checkpoint = i / k;  // reads its input from here
        ops.push_back(op);
      }
    }
    for (int i = block_end - 1; i >= block_start; --i) {
      ops.push_back(
          {StageKind::kLayerBackward, i, false, false, set_of(i), -1, {layer_entry(i)}, true});
    }
    if (s.keep_all) break;
  }
  ops.push_back(EmbedOp(StageKind::kEmbedBackward, s.embedding_entry));
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
