// A tied embedding's rows' gradient kept apart (StorePlacement::rows_gradient_entry, what a
// data-parallel rank does, docs/scale_out.md): the executor leaves the LM head's gradient alone in
// the slab and scatters the rows into the second array from -0.0, so slab + apart (the world of
// one's ReduceFloatPairsInRankOrder) is bit for bit the slab of an executor without it, over
// several steps and micro-batches; rows no token touched stay -0.0; an untied layout, or an entry
// that is not the embedding, is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "engine/dist/communicator.h"
#include "tests/engine/executor_rig.h"

namespace megatrain::engine {
namespace {

using testing::MakeCpuDevice;
using testing::MakeTokenBatches;
using testing::TinyConfig;
using testing::TinyShape;

constexpr int kSeq = 16;

TinyShape Shape(bool tied) {
  TinyShape shape;
  shape.layers = 2;
  shape.tied = tied;
  return shape;
}

using Rig = testing::ExecutorRig;

absl::StatusOr<Rig> MakeRig(const TinyShape& shape, int rows_gradient_entry) {
  StorePlacement placement;
  placement.rows_gradient_entry = rows_gradient_entry;
  ExecutorOptions options;
  options.weight_slots = 2;
  return testing::MakeExecutorRig(shape, kSeq, placement, options);
}

TEST(RowsGradientApartTest, SlabPlusRowsIsTheOneSlabBitForBit) {
  const TinyShape shape = Shape(/*tied=*/true);
  absl::StatusOr<Rig> plain = MakeRig(shape, -1);
  ASSERT_TRUE(plain.ok()) << plain.status();
  absl::StatusOr<Rig> apart = MakeRig(shape, 0);
  ASSERT_TRUE(apart.ok()) << apart.status();
  const int e = apart->embedding_entry;
  ASSERT_EQ(e, 0);
  ASSERT_EQ(plain->store->rows_gradient(e), nullptr);
  float* rows = apart->store->rows_gradient(e);
  ASSERT_NE(rows, nullptr);
  for (int other = 1; other < apart->store->num_entries(); ++other) {
    EXPECT_EQ(apart->store->rows_gradient(other), nullptr);
  }
  const size_t n = apart->store->spec(e).elements;
  const size_t hidden = static_cast<size_t>(shape.hidden);
  // Steps of one micro-batch (a data-parallel rank's exact case) and of two (its sum of its own
  // micro-batches): each step's first micro-batch resets the array apart.
  const testing::TokenBatches batches = MakeTokenBatches(5, kSeq, shape.vocab, 9);
  int next = 0;
  for (int micro_batches : {1, 2, 1}) {
    std::vector<bool> touched(static_cast<size_t>(shape.vocab), false);
    for (int m = 0; m < micro_batches; ++m, ++next) {
      for (int32_t id : batches.inputs[next]) touched[static_cast<size_t>(id)] = true;
      for (Rig* rig : {&*plain, &*apart}) {
        absl::StatusOr<MicroBatchResult> r = rig->executor->RunMicroBatch(
            batches.inputs[next].data(), batches.targets[next].data(), 1.0f / 64, m == 0, 0);
        ASSERT_TRUE(r.ok()) << r.status();
      }
    }
    // Rows no token of the step touched: -0.0 apart. Touched rows: the scatter's sums.
    size_t negative_zeros = 0, touched_nonzero = 0;
    for (size_t row = 0; row < touched.size(); ++row) {
      for (size_t j = 0; j < hidden; ++j) {
        const float x = rows[row * hidden + j];
        if (!touched[row]) {
          ASSERT_TRUE(x == 0.0f && std::signbit(x)) << "untouched row " << row << " holds " << x;
          ++negative_zeros;
        } else if (x != 0.0f) {
          ++touched_nonzero;
        }
      }
    }
    EXPECT_GT(negative_zeros, 0u);
    EXPECT_GT(touched_nonzero, 0u);
    const float* one_slab = plain->store->entry(e).grad;
    std::vector<float> sum(apart->store->entry(e).grad, apart->store->entry(e).grad + n);
    if (micro_batches == 1) {
      // h_0 + E_0: one process's slab exactly, the LM head's part not (it lacks the rows).
      EXPECT_NE(std::memcmp(sum.data(), one_slab, n * sizeof(float)), 0);
      dist::SingleProcessCommunicator one;
      ASSERT_TRUE(one.ReduceFloatPairsInRankOrder(sum.data(), rows, n).ok());
      EXPECT_EQ(std::memcmp(sum.data(), one_slab, n * sizeof(float)), 0)
          << "slab + rows apart differs from one slab";
    } else {
      // (h_0 + h_1) + (E_0 + E_1): every element within fp32 rounding of one process's
      // ((h_0 + E_0) + h_1) + E_1, relative to the table's largest part.
      double scale = 0;
      for (size_t i = 0; i < n; ++i) {
        scale = std::max(scale, static_cast<double>(std::fabs(sum[i]) + std::fabs(rows[i])));
      }
      ASSERT_GT(scale, 0.0);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_NEAR(sum[i] + rows[i], one_slab[i], 1e-5 * scale) << i;
      }
    }
    // Every other entry's gradient is untouched by keeping the rows apart.
    for (int other = 1; other < apart->store->num_entries(); ++other) {
      EXPECT_EQ(std::memcmp(apart->store->entry(other).grad, plain->store->entry(other).grad,
                            apart->store->spec(other).elements * sizeof(float)),
                0)
          << "entry " << other;
    }
  }
}

TEST(RowsGradientApartTest, RefusedOutsideATiedEmbedding) {
  // Untied: the embedding's slab would get nothing with its rows scattered elsewhere.
  absl::StatusOr<Rig> untied = MakeRig(Shape(/*tied=*/false), 0);
  ASSERT_FALSE(untied.ok());
  EXPECT_EQ(untied.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(untied.status().message().find("rows_gradient_entry=0"), std::string::npos)
      << untied.status();
  // Tied, but not the embedding's entry.
  absl::StatusOr<Rig> layer = MakeRig(Shape(/*tied=*/true), 1);
  ASSERT_FALSE(layer.ok());
  EXPECT_NE(layer.status().message().find("rows_gradient_entry=1"), std::string::npos)
      << layer.status();
  // No such entry: the store refuses it.
  absl::StatusOr<Rig> outside = MakeRig(Shape(/*tied=*/true), 99);
  ASSERT_FALSE(outside.ok());
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(outside.status().message().find("rows_gradient_entry=99 names no entry"),
            std::string::npos)
      << outside.status();
}

}  // namespace
}  // namespace megatrain::engine
