// Gradient accumulation: two micro-batches of one sequence give the gradient
// of one micro-batch of both sequences (up to fp32 rounding of different GEMM
// shapes), including a tied embedding larger than the executor's 4 MiB
// host staging chunk, whose second contribution is added chunk by chunk.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/engine/tiny_model.h"

namespace megatrain::engine {
namespace {

using testing::MakeCpuDevice;
using testing::MakeTokenBatches;
using testing::TinyConfig;
using testing::TinyShape;

TEST(AccumulationTest, MicroBatchesAddUpToTheWholeBatch) {
  TinyShape shape;
  shape.layers = 2;
  shape.hidden = 256;
  shape.ffn = 344;
  shape.heads = 4;
  shape.kv_heads = 2;
  shape.vocab = 4100;  // tied embedding of 4100 x 256 floats > 2^20
  shape.tied = true;
  const auto batches = MakeTokenBatches(2, 16, shape.vocab, 23);
  std::vector<int32_t> both_inputs(batches.inputs[0]), both_targets(batches.targets[0]);
  both_inputs.insert(both_inputs.end(), batches.inputs[1].begin(), batches.inputs[1].end());
  both_targets.insert(both_targets.end(), batches.targets[1].begin(), batches.targets[1].end());

  auto gradients = [&](int micro_batch_size) {
    TrainerOptions o;
    o.micro_batch_size = micro_batch_size;
    o.seq_len = 16;
    o.lr.total_steps = 1;
    o.executor.weight_slots = 2;
    auto device = MakeCpuDevice(size_t{96} << 20);
    auto trainer = Trainer::Create(*device, TinyConfig(shape), o);
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    (*trainer)->InitializeRandom(5);
    absl::StatusOr<StepReport> r =
        micro_batch_size == 1
            ? (*trainer)->Step(batches.InputPointers(0, 2), batches.TargetPointers(0, 2))
            : (*trainer)->Step({both_inputs.data()}, {both_targets.data()});
    EXPECT_TRUE(r.ok()) << r.status();
    std::vector<std::vector<float>> grads;
    for (const auto& entry : (*trainer)->layout().entries()) {
      for (const TensorSlot& slot : entry.tensors) {
        grads.push_back(*(*trainer)->ReadGradient(slot.hf_name));
      }
    }
    return grads;
  };
  const auto accumulated = gradients(1);
  const auto whole = gradients(2);
  ASSERT_EQ(accumulated.size(), whole.size());
  for (size_t t = 0; t < whole.size(); ++t) {
    double scale = 0;
    for (float g : whole[t]) scale = std::max(scale, static_cast<double>(std::fabs(g)));
    ASSERT_GT(scale, 0.0) << "tensor " << t;
    for (size_t i = 0; i < whole[t].size(); ++i) {
      // Same math, different GEMM shapes and summation points: fp32 rounding only.
      ASSERT_NEAR(accumulated[t][i], whole[t][i], 1e-4 * scale)
          << "tensor " << t << "[" << i << "]";
    }
  }
}

}  // namespace
}  // namespace megatrain::engine
