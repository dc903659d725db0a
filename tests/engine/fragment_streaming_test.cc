// Fragmented weight streaming (ExecutorOptions::weight_ring_bytes): losses,
// gradients, evaluation losses and weights after a few steps are bitwise those
// of whole-layer streaming whatever the ring (one layer, half a layer, odd
// sizes with odd wrap points), the fragment size, the link and the schedule;
// a part starts before its layer's last fragment arrived; too small a ring is
// refused naming the tensor; the LM head streams in vocabulary blocks, so the
// device memory does not grow with the vocabulary.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "engine/model/parameter_layout.h"
#include "engine/exec/executor_geometry.h"
#include "tests/engine/bitwise_compare.h"
#include "tests/engine/tiny_model.h"

namespace megatrain::engine {
namespace {

using testing::MakeCpuDevice;
using testing::MakeTokenBatches;
using testing::TinyConfig;
using testing::TinyShape;

constexpr int kSeq = 23;
constexpr int kMicroBatch = 2;
constexpr int kSteps = 4;

struct RunConfig {
  std::string name;
  int weight_slots = 2;
  double ring_layers = 0;  // weight_ring_bytes in layers (0 = whole-layer slots)
  size_t ring_extra_bytes = 0;
  size_t fragment_bytes = 0;
  int k = 2;
  bool keep_all = false;
  int device_checkpoints = -1;
  double link_gbps = 0;
  bool serial = false;
  int head_block_rows = 0;
};

struct RunResult {
  std::vector<double> losses;
  double eval_loss = 0;
  std::vector<std::vector<float>> masters;
  std::vector<std::vector<float>> grads;
  bool fragment_mode = false;
};

// Ring bytes one layer of `shape` takes on the CPU device.
size_t LayerRing(const TinyShape& shape) {
  const ModelConfig config = TinyConfig(shape);
  absl::StatusOr<ParameterLayout> layout = ParameterLayout::Create(config);
  EXPECT_TRUE(layout.ok());
  absl::StatusOr<ExecutorGeometry> g =
      MakeExecutorGeometry(config, *layout, kMicroBatch, kSeq, /*head_chunk=*/16);
  EXPECT_TRUE(g.ok());
  return StreamingExecutor::LayerRingBytes(g->dims, g->layout.layer_offsets);
}

TrainerOptions Options(const RunConfig& rc, const TinyShape& shape) {
  TrainerOptions o;
  o.micro_batch_size = kMicroBatch;
  o.seq_len = kSeq;
  o.head_chunk = 16;
  o.lr.peak_lr = 3e-3;
  o.lr.warmup_steps = 2;
  o.lr.total_steps = kSteps;
  o.grad_clip = 0.5;
  o.executor.checkpoint_interval = rc.k;
  o.executor.keep_all = rc.keep_all;
  o.executor.device_checkpoints = rc.device_checkpoints;
  o.executor.weight_slots = rc.weight_slots;
  o.executor.serial = rc.serial;
  if (rc.ring_layers > 0) {
    o.executor.weight_ring_bytes =
        static_cast<size_t>(rc.ring_layers * static_cast<double>(LayerRing(shape))) +
        rc.ring_extra_bytes;
  }
  o.executor.fragment_bytes = rc.fragment_bytes;
  o.head_block_rows = rc.head_block_rows;
  return o;
}

RunResult Train(const RunConfig& rc, const TinyShape& shape) {
  RunResult result;
  auto device = MakeCpuDevice(size_t{256} << 20, rc.link_gbps, rc.link_gbps > 0 ? 5 : 0);
  auto trainer = Trainer::Create(*device, TinyConfig(shape), Options(rc, shape));
  EXPECT_TRUE(trainer.ok()) << rc.name << ": " << trainer.status();
  if (!trainer.ok()) return result;
  Trainer& t = **trainer;
  result.fragment_mode = t.executor().fragment_mode();
  t.InitializeRandom(7);
  const auto batches = MakeTokenBatches(2 * kSteps + 2, kMicroBatch * kSeq, shape.vocab, 99);
  for (int step = 0; step < kSteps; ++step) {
    auto report = t.Step(batches.InputPointers(2 * step, 2), batches.TargetPointers(2 * step, 2));
    EXPECT_TRUE(report.ok()) << rc.name << ": " << report.status();
    if (!report.ok()) return result;
    result.losses.push_back(report->loss);
  }
  t.WaitForUpdates();
  const ParameterStore& store = t.store();
  for (int e = 0; e < store.num_entries(); ++e) {
    const float* p = store.entry(e).master;
    const float* g = store.entry(e).grad;
    result.masters.emplace_back(p, p + store.spec(e).elements);
    result.grads.emplace_back(g, g + store.spec(e).elements);
  }
  absl::StatusOr<double> eval =
      t.Evaluate(batches.InputPointers(2 * kSteps, 2), batches.TargetPointers(2 * kSteps, 2));
  EXPECT_TRUE(eval.ok()) << rc.name << ": " << eval.status();
  if (eval.ok()) result.eval_loss = *eval;
  return result;
}

void ExpectBitwiseEqual(const RunResult& a, const RunResult& b, const std::string& name) {
  testing::ExpectSameLosses(a.losses, b.losses, name);
  EXPECT_EQ(std::memcmp(&a.eval_loss, &b.eval_loss, sizeof(double)), 0)
      << name << ": evaluation " << a.eval_loss << " vs " << b.eval_loss;
  testing::ExpectSameArrays(a.masters, b.masters, name + " masters");
  testing::ExpectSameArrays(a.grads, b.grads, name + " gradients");
}

// Vocabulary blocks of the head: one (97 rows), and eight of 11 with a short
// one of 9 (the fragmented head then copies out a gradient per block).
class FragmentStreamingBlocksTest : public ::testing::TestWithParam<int> {};

INSTANTIATE_TEST_SUITE_P(HeadBlockRows, FragmentStreamingBlocksTest, ::testing::Values(0, 11));

TEST_P(FragmentStreamingBlocksTest, BitwiseIdenticalToWholeLayerStreaming) {
  const int block_rows = GetParam();
  // Llama untied and tied, and Qwen3 (q_norm / k_norm travel in the q / k
  // parts' units; head_dim 10 != hidden / heads = 8).
  for (int model = 0; model < 3; ++model) {
    const bool tied = model == 1;
    TinyShape shape;  // LM head 97 x 48 floats: under half a layer
    shape.layers = 5;
    shape.tied = tied;
    if (model == 2) {
      shape.model_type = "qwen3";
      shape.head_dim = 10;
    }
    const std::string suffix = std::string(model == 2 ? " (qwen3)" : tied ? " (tied)" : " (untied)") +
                               ", head blocks of " + std::to_string(block_rows);
    const RunResult reference =
        Train({.name = "whole-layer slots", .head_block_rows = block_rows}, shape);
    ASSERT_EQ(reference.losses.size(), static_cast<size_t>(kSteps));
    EXPECT_FALSE(reference.fragment_mode);
    for (double loss : reference.losses) EXPECT_TRUE(std::isfinite(loss));
    const std::vector<RunConfig> variants = {
        {.name = "ring 1 layer, default fragments", .ring_layers = 1.0},
        {.name = "ring 1/2 layer, 1000-byte fragments", .ring_layers = 0.5, .fragment_bytes = 1000},
        {.name = "ring 0.61 layer + 13 B, 777-byte fragments, throttled",
         .ring_layers = 0.61,
         .ring_extra_bytes = 13,
         .fragment_bytes = 777,
         .link_gbps = 2.0},
        {.name = "ring 1.37 layer + 5 B, 4097-byte fragments, host checkpoints, k=1",
         .ring_layers = 1.37,
         .ring_extra_bytes = 5,
         .fragment_bytes = 4097,
         .k = 1,
         .device_checkpoints = 0},
        {.name = "ring 1/2 layer, 333-byte fragments, keep-all, throttled",
         .ring_layers = 0.5,
         .fragment_bytes = 333,
         .keep_all = true,
         .link_gbps = 0.5},
        {.name = "ring 1/2 layer, serial",
         .ring_layers = 0.5,
         .fragment_bytes = 2049,
         .serial = true},
        {.name = "ring of every weight, k=4", .ring_layers = 7.0, .k = 4},
    };
    for (RunConfig rc : variants) {
      rc.head_block_rows = block_rows;
      const RunResult got = Train(rc, shape);
      EXPECT_TRUE(got.fragment_mode) << rc.name;
      ExpectBitwiseEqual(reference, got, rc.name + suffix);
    }
  }
}

TEST(FragmentStreamingTest, PartsStartBeforeTheLayersLastFragmentArrives) {
  TinyShape shape;
  shape.layers = 3;
  auto device = MakeCpuDevice(size_t{256} << 20, /*link_gbps=*/0.02, /*latency_us=*/5);
  TrainerOptions o =
      Options({.name = "timeline", .ring_layers = 1.0, .fragment_bytes = 4000}, shape);
  o.collect_timeline = true;
  auto trainer = Trainer::Create(*device, TinyConfig(shape), o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  (*trainer)->InitializeRandom(3);
  const auto batches = MakeTokenBatches(2, kMicroBatch * kSeq, shape.vocab, 5);
  device->timeline().Clear();
  ASSERT_TRUE((*trainer)->Step(batches.InputPointers(0, 1), batches.TargetPointers(0, 1)).ok());
  const std::vector<TimelineSpan> spans = device->timeline().Spans();
  int checked = 0;
  for (int layer = 0; layer < shape.layers; ++layer) {
    const std::string label = absl::StrCat("layer.fwd.", layer);
    int64_t first_compute = -1, last_copy_end = -1;
    int copies = 0;
    for (const TimelineSpan& s : spans) {
      if (s.label != label) continue;
      if (s.kind == SpanKind::kCompute && (first_compute < 0 || s.begin_ns < first_compute)) {
        first_compute = s.begin_ns;
      }
      if (s.kind == SpanKind::kCopyIn) {
        last_copy_end = std::max(last_copy_end, s.end_ns);
        ++copies;
      }
    }
    ASSERT_GE(first_compute, 0) << label;
    EXPECT_GT(copies, 9) << label << ": one copy per tensor at least, row blocks more";
    EXPECT_LT(first_compute, last_copy_end)
        << label << ": its first part waited for the whole layer's weights";
    ++checked;
  }
  EXPECT_EQ(checked, shape.layers);
}

TEST(FragmentStreamingTest, CreateRefusesARingSmallerThanTheLargestTensor) {
  TinyShape shape;
  const size_t gate_bytes = size_t{48} * 88 * sizeof(float);
  {
    auto device = MakeCpuDevice(size_t{256} << 20);
    TrainerOptions o = Options({}, shape);
    o.executor.weight_ring_bytes = gate_bytes - 1;
    auto trainer = Trainer::Create(*device, TinyConfig(shape), o);
    ASSERT_FALSE(trainer.ok());
    EXPECT_EQ(trainer.status().code(), absl::StatusCode::kInvalidArgument) << trainer.status();
    const std::string message(trainer.status().message());
    EXPECT_TRUE(absl::StrContains(message, absl::StrCat("weight_ring_bytes=", gate_bytes - 1)))
        << message;
    EXPECT_TRUE(absl::StrContains(message, "'layer 0 gate'")) << message;
    EXPECT_TRUE(absl::StrContains(message, absl::StrCat(gate_bytes, " bytes"))) << message;
  }
  {
    // A large vocabulary in one block: the block outgrows a one-layer ring.
    TinyShape big_vocab = shape;
    big_vocab.vocab = 997;
    auto device = MakeCpuDevice(size_t{256} << 20);
    TrainerOptions o = Options({.name = "big vocab", .ring_layers = 1.0}, big_vocab);
    o.head_block_rows = 997;
    auto trainer = Trainer::Create(*device, TinyConfig(big_vocab), o);
    ASSERT_FALSE(trainer.ok());
    EXPECT_EQ(trainer.status().code(), absl::StatusCode::kInvalidArgument) << trainer.status();
    const std::string message(trainer.status().message());
    EXPECT_TRUE(absl::StrContains(message, "'lm_head rows 0-996'")) << message;
    EXPECT_TRUE(absl::StrContains(message, absl::StrCat(size_t{997} * 48 * sizeof(float))))
        << message;
    // In blocks of 100 rows the same ring trains.
    o.head_block_rows = 100;
    trainer = Trainer::Create(*device, TinyConfig(big_vocab), o);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    (*trainer)->InitializeRandom(5);
    const auto batches = MakeTokenBatches(1, kMicroBatch * kSeq, big_vocab.vocab, 6);
    absl::StatusOr<StepReport> report =
        (*trainer)->Step(batches.InputPointers(0, 1), batches.TargetPointers(0, 1));
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_TRUE(std::isfinite(report->loss));
  }
}

// The device memory of a fragmented run is the same for a vocabulary 10x
// larger: the ring holds one block, the gradient buffers one block's gradient.
TEST(FragmentStreamingTest, DeviceMemoryDoesNotGrowWithTheVocabulary) {
  size_t totals[2] = {0, 0};
  size_t rings[2] = {0, 0};
  const int vocabs[2] = {997, 9973};
  for (int i = 0; i < 2; ++i) {
    TinyShape shape;
    shape.vocab = vocabs[i];
    auto device = MakeCpuDevice(size_t{256} << 20);
    TrainerOptions o = Options({.name = "vocab", .ring_layers = 0.5}, shape);
    o.head_block_rows = 64;
    auto trainer = Trainer::Create(*device, TinyConfig(shape), o);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    totals[i] = (*trainer)->executor().plan().total();
    rings[i] = (*trainer)->executor().plan().weight_slots;
  }
  EXPECT_EQ(rings[0], rings[1]);
  EXPECT_EQ(totals[0], totals[1]) << "vocabulary " << vocabs[0] << " vs " << vocabs[1];
}

TEST(FragmentStreamingTest, DevicePlanCountsTheRingAsTheWeightLine) {
  TinyShape shape;
  auto device = MakeCpuDevice(size_t{256} << 20);
  const TrainerOptions o =
      Options({.name = "plan", .ring_layers = 0.5, .ring_extra_bytes = 7}, shape);
  auto trainer = Trainer::Create(*device, TinyConfig(shape), o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const DeviceMemoryPlan& plan = (*trainer)->executor().plan();
  EXPECT_TRUE(plan.weight_ring);
  EXPECT_EQ(plan.weight_slots, (o.executor.weight_ring_bytes + 255) / 256 * 256);
  EXPECT_EQ((*trainer)->executor().weight_slots(), 0);
  EXPECT_TRUE(absl::StrContains(plan.Describe(), "weight ring")) << plan.Describe();
}

}  // namespace
}  // namespace megatrain::engine
