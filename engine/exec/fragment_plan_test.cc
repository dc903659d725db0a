// FragmentPlan: consumption order, row blocks within fragment_bytes, ring
// placement inside the ring, blockers that cover every overwritten byte and
// can never deadlock, and the refusal of too small a ring.
#include "engine/exec/fragment_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>

namespace megatrain::engine {
namespace {

constexpr size_t kFloat = sizeof(float);

// Odd sizes: d = 40, 5 q heads of 8, 1 kv head, ffn 67, vocab 51; q/k/v biases.
struct Model {
  ModelDims dims;
  LayerOffsets offsets;
  ScheduleShape shape;
  std::vector<size_t> entry_elements;
};

Model MakeModel(int layers, bool tied, int64_t vocab = 51, int64_t head_block_rows = 0) {
  Model m;
  m.dims.vocab = vocab;
  m.dims.head_block_rows = head_block_rows;
  m.dims.hidden = 40;
  m.dims.ffn = 67;
  m.dims.q_heads = 5;
  m.dims.kv_heads = 1;
  m.dims.head_dim = 8;
  m.dims.num_layers = layers;
  m.dims.batch = 1;
  m.dims.seq = 7;
  m.dims.head_chunk = 7;
  int64_t at = 0;
  auto place = [&](TensorRole t, int64_t* field) {
    *field = at;
    at += ExtentOf(m.dims, t).elements;
  };
  LayerOffsets& o = m.offsets;
  place(TensorRole::kInputNorm, &o.input_norm);
  place(TensorRole::kQ, &o.q);
  place(TensorRole::kQBias, &o.q_bias);
  place(TensorRole::kK, &o.k);
  place(TensorRole::kKBias, &o.k_bias);
  place(TensorRole::kV, &o.v);
  place(TensorRole::kVBias, &o.v_bias);
  place(TensorRole::kO, &o.o);
  place(TensorRole::kPostAttentionNorm, &o.post_norm);
  place(TensorRole::kGate, &o.gate);
  place(TensorRole::kUp, &o.up);
  place(TensorRole::kDown, &o.down);
  // Entries: embedding, layers..., final norm, (lm head).
  m.shape.num_layers = layers;
  m.shape.checkpoint_interval = 2;
  m.shape.embedding_entry = 0;
  m.shape.first_layer_entry = 1;
  m.shape.final_norm_entry = 1 + layers;
  m.shape.lm_head_entry = tied ? 0 : 2 + layers;
  m.entry_elements.push_back(static_cast<size_t>(m.dims.vocab * m.dims.hidden));
  for (int l = 0; l < layers; ++l) m.entry_elements.push_back(static_cast<size_t>(at));
  m.entry_elements.push_back(static_cast<size_t>(m.dims.hidden));
  if (!tied) m.entry_elements.push_back(static_cast<size_t>(m.dims.vocab * m.dims.hidden));
  return m;
}

FragmentPlanInputs Inputs(const Model& m, size_t ring_bytes, size_t fragment_bytes) {
  FragmentPlanInputs in;
  in.dims = m.dims;
  in.offsets = m.offsets;
  in.entry_elements = m.entry_elements;
  in.element_bytes = kFloat;
  in.ring_bytes = ring_bytes;
  in.fragment_bytes = fragment_bytes;
  return in;
}

size_t Round256Up(size_t bytes) { return (bytes + 255) / 256 * 256; }

size_t End(const WeightFragment& f) {
  return f.ring_offset + static_cast<size_t>(f.elements) * kFloat;
}

void CheckPlan(const FragmentPlan& plan, const ModelDims& dims,
               const std::vector<ScheduledOp>& ops, size_t ring_bytes, size_t fragment_bytes,
               const std::string& name) {
  ASSERT_FALSE(plan.fragments.empty()) << name;
  for (size_t f = 0; f < plan.fragments.size(); ++f) {
    const WeightFragment& fr = plan.fragments[f];
    const PlannedTensor& t = plan.tensors[fr.tensor];
    EXPECT_LE(End(fr), ring_bytes) << name << " fragment " << f;
    EXPECT_EQ(t.ring_offset % 256, 0u) << name << " " << t.name;
    // Row blocks: within fragment_bytes unless one row is larger.
    const size_t bytes = static_cast<size_t>(fr.elements) * kFloat;
    if (t.fragment_count > 1) {
      EXPECT_LE(bytes, std::max<size_t>(fragment_bytes, 67 * kFloat));
    }
    EXPECT_LE(fr.first_reader, fr.last_reader);
    // No wait can deadlock: the blocker is freed by a part before this one is read.
    if (fr.blocker >= 0) {
      EXPECT_LT(fr.blocker, static_cast<int>(f));
      EXPECT_LT(plan.fragments[fr.blocker].last_reader, fr.first_reader) << name;
    }
    // Every earlier overlapping fragment is freed no later than the blocker,
    // so waiting for the blocker's free covers it.
    for (size_t g = 0; g < f; ++g) {
      const WeightFragment& other = plan.fragments[g];
      if (End(other) <= fr.ring_offset || other.ring_offset >= End(fr)) continue;
      ASSERT_GE(fr.blocker, 0) << name << " fragment " << f << " overlaps " << g;
      EXPECT_LE(other.last_reader, plan.fragments[fr.blocker].last_reader)
          << name << " fragment " << f << " overlaps " << g;
    }
  }
  // Each part waits for a fragment of its own op, and frees only fragments it has waited for.
  for (size_t p = 0; p < plan.parts.size(); ++p) {
    const PlannedPart& part = plan.parts[p];
    ASSERT_GE(part.last_fragment, 0) << name;
    EXPECT_EQ(plan.tensors[plan.fragments[part.last_fragment].tensor].op, part.op);
    for (int f : part.frees) EXPECT_LE(f, part.last_fragment) << name;
  }
  // Parts per op: layers kLayerParts, the head HeadPartCount, host stages none.
  for (size_t o = 0; o < ops.size(); ++o) {
    const int want = ops[o].entries.empty() ? 0
                     : ops[o].kind == StageKind::kHead
                         ? HeadPartCount(dims, ops[o].produces_gradients)
                         : kLayerParts;
    EXPECT_EQ(plan.part_count[o], want) << name << " op " << o;
  }
}

TEST(FragmentPlanTest, TensorsFollowEachOpsConsumptionOrder) {
  const Model m = MakeModel(3, false);
  const std::vector<ScheduledOp> ops = BuildStepSchedule(m.shape);
  absl::StatusOr<FragmentPlan> plan = PlanFragments(ops, Inputs(m, size_t{1} << 20, 1 << 20));
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<std::string> forward, backward, head;
  for (const PlannedTensor& t : plan->tensors) {
    const ScheduledOp& op = ops[t.op];
    if (op.layer != 1 && op.kind != StageKind::kHead) continue;
    if (op.kind == StageKind::kLayerForward && !op.recompute) forward.push_back(t.name);
    if (op.kind == StageKind::kLayerBackward) backward.push_back(t.name);
    if (op.kind == StageKind::kHead) head.push_back(t.name);
  }
  EXPECT_EQ(forward, (std::vector<std::string>{"layer 1 input_norm", "layer 1 q", "layer 1 q_bias",
                                               "layer 1 k", "layer 1 k_bias", "layer 1 v",
                                               "layer 1 v_bias", "layer 1 o", "layer 1 post_norm",
                                               "layer 1 gate", "layer 1 up", "layer 1 down"}));
  EXPECT_EQ(backward, (std::vector<std::string>{
                          "layer 1 down", "layer 1 gate", "layer 1 up", "layer 1 post_norm",
                          "layer 1 o", "layer 1 q", "layer 1 q_bias", "layer 1 k", "layer 1 k_bias",
                          "layer 1 v", "layer 1 v_bias", "layer 1 input_norm"}));
  EXPECT_EQ(head, (std::vector<std::string>{"final_norm", "lm_head rows 0-50",
                                            "lm_head rows 0-50 (backward)", "final_norm"}));
  // Copies follow the tensors: fragments are in tensor order.
  for (size_t f = 1; f < plan->fragments.size(); ++f) {
    EXPECT_LE(plan->fragments[f - 1].tensor, plan->fragments[f].tensor);
  }
}

// The head's parts in order: the norm, each block, each block again, the norm.
TEST(FragmentPlanTest, TheHeadStreamsItsVocabularyBlocksTwice) {
  const Model m = MakeModel(2, true, /*vocab=*/101, /*head_block_rows=*/30);
  const std::vector<ScheduledOp> ops = BuildStepSchedule(m.shape);
  absl::StatusOr<FragmentPlan> plan = PlanFragments(ops, Inputs(m, size_t{1} << 20, 1 << 20));
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<std::string> head;
  for (const PlannedTensor& t : plan->tensors) {
    if (ops[t.op].kind == StageKind::kHead) head.push_back(t.name);
  }
  EXPECT_EQ(head, (std::vector<std::string>{
                      "final_norm", "lm_head rows 0-29", "lm_head rows 30-59",
                      "lm_head rows 60-89", "lm_head rows 90-100",
                      "lm_head rows 0-29 (backward)", "lm_head rows 30-59 (backward)",
                      "lm_head rows 60-89 (backward)", "lm_head rows 90-100 (backward)",
                      "final_norm"}));
  // Evaluation reads each block once.
  const std::vector<ScheduledOp> eval = BuildEvalSchedule(m.shape);
  plan = PlanFragments(eval, Inputs(m, size_t{1} << 20, 1 << 20));
  ASSERT_TRUE(plan.ok()) << plan.status();
  int eval_head = 0;
  for (const PlannedTensor& t : plan->tensors) eval_head += eval[t.op].kind == StageKind::kHead;
  EXPECT_EQ(eval_head, 1 + 4);
}

// A vocabulary far larger than the ring streams through it block by block.
TEST(FragmentPlanTest, AVocabularyLargerThanTheRingStreamsInBlocks) {
  const Model m = MakeModel(2, false, /*vocab=*/5000, /*head_block_rows=*/64);
  const size_t gate = Round256Up(static_cast<size_t>(m.dims.ffn * m.dims.hidden) * kFloat);
  const size_t lm_head = static_cast<size_t>(m.dims.vocab * m.dims.hidden) * kFloat;
  const size_t ring = 2 * gate;
  ASSERT_LT(ring * 10, lm_head);
  for (const auto& ops : {BuildStepSchedule(m.shape), BuildEvalSchedule(m.shape)}) {
    absl::StatusOr<FragmentPlan> plan = PlanFragments(ops, Inputs(m, ring, 4096));
    ASSERT_TRUE(plan.ok()) << plan.status();
    CheckPlan(*plan, m.dims, ops, ring, 4096, "vocab 5000 in blocks of 64");
  }
}

TEST(FragmentPlanTest, RingsOfEverySizeAreSafe) {
  for (const auto& [tied, block_rows] : {std::pair{false, 0}, std::pair{true, 0},
                                         std::pair{false, 13}, std::pair{true, 13}}) {
    const Model m = MakeModel(4, tied, 51, block_rows);
    const size_t layer = LayerRingBytes(m.dims, m.offsets, kFloat);
    const size_t block = Round256Up(static_cast<size_t>(HeadBlockRows(m.dims) * m.dims.hidden) *
                                    kFloat);
    const size_t gate = Round256Up(static_cast<size_t>(m.dims.ffn * m.dims.hidden) * kFloat);
    // The smallest ring that runs: the largest tensor or vocabulary block.
    const size_t smallest = std::max(gate, block) + 3;
    for (size_t ring : {layer, layer / 2 + 1, smallest, layer + 1001, 3 * layer + 77}) {
      for (size_t fragment :
           {size_t{1}, size_t{333}, size_t{1000}, size_t{4097}, size_t{1} << 20}) {
        for (const auto& ops : {BuildStepSchedule(m.shape), BuildEvalSchedule(m.shape)}) {
          const std::string name = "ring " + std::to_string(ring) + " fragment " +
                                   std::to_string(fragment) + (tied ? " tied" : "") +
                                   " blocks of " + std::to_string(block_rows);
          absl::StatusOr<FragmentPlan> plan = PlanFragments(ops, Inputs(m, ring, fragment));
          ASSERT_TRUE(plan.ok()) << name << ": " << plan.status();
          CheckPlan(*plan, m.dims, ops, ring, fragment, name);
        }
      }
    }
  }
}

TEST(FragmentPlanTest, RefusesARingSmallerThanATensor) {
  const Model m = MakeModel(2, false);
  const std::vector<ScheduledOp> ops = BuildStepSchedule(m.shape);
  const size_t down = static_cast<size_t>(m.dims.hidden * m.dims.ffn) * kFloat;
  absl::StatusOr<FragmentPlan> plan = PlanFragments(ops, Inputs(m, down - 1, 1000));
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(plan.status().message());
  EXPECT_NE(message.find("weight_ring_bytes=" + std::to_string(down - 1)), std::string::npos)
      << message;
  EXPECT_NE(message.find("'layer 0 gate' (" + std::to_string(down) + " bytes)"), std::string::npos)
      << message;

  // A vocabulary block larger than the ring is named; smaller blocks fit it.
  const Model big = MakeModel(2, false, /*vocab=*/301);
  const size_t lm_head = static_cast<size_t>(big.dims.vocab * big.dims.hidden) * kFloat;
  plan = PlanFragments(ops, Inputs(big, lm_head - 10, 1000));
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(plan.status().message()).find("'lm_head rows 0-300'"), std::string::npos)
      << plan.status();
  const Model blocked = MakeModel(2, false, /*vocab=*/301, /*head_block_rows=*/150);
  EXPECT_TRUE(PlanFragments(ops, Inputs(blocked, lm_head - 10, 1000)).ok());
  EXPECT_FALSE(PlanFragments(ops, Inputs(m, 1 << 20, 0)).ok()) << "fragment_bytes 0";
}

}  // namespace
}  // namespace megatrain::engine
