// Tests for the embedding gather and its ordered scatter-add gradient.
#include "kernels/cpu/embedding.h"

#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/test_util.h"

namespace megatrain::kernels::cpu {
namespace {

using testing::AllClose;
using testing::RandomFloats;

constexpr int64_t kVocab = 53;
constexpr int64_t kDim = 37;

TEST(EmbeddingTest, ForwardGathersRowsExactly) {
  const std::vector<float> table = RandomFloats(kVocab * kDim, 1);
  const std::vector<int32_t> ids = {0, 52, 7, 7, 31, 0, 12, 52, 3, 9, 44, 7, 1};
  std::vector<float> out(ids.size() * kDim, -1.0f);
  EmbeddingForward(table.data(), kVocab, kDim, ids.data(), static_cast<int64_t>(ids.size()),
                   out.data());
  for (size_t t = 0; t < ids.size(); ++t) {
    for (int64_t i = 0; i < kDim; ++i) {
      ASSERT_EQ(out[t * kDim + i], table[ids[t] * kDim + i]) << t << "," << i;
    }
  }
}

TEST(EmbeddingTest, BackwardAccumulatesDuplicatesInTokenOrder) {
  const std::vector<int32_t> ids = {0, 52, 7, 7, 31, 0, 12, 52, 3, 9, 44, 7, 1};
  const int64_t n = static_cast<int64_t>(ids.size());
  const std::vector<float> dout = RandomFloats(n * kDim, 2);
  const std::vector<float> initial = RandomFloats(kVocab * kDim, 3);
  std::vector<float> dtable = initial;
  EmbeddingBackward(dout.data(), ids.data(), n, kVocab, kDim, dtable.data());

  // The contract is the exact fp32 sequence: initial, then tokens in order.
  std::vector<float> expected = initial;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < kDim; ++i) expected[ids[t] * kDim + i] += dout[t * kDim + i];
  }
  EXPECT_TRUE(testing::BitwiseEqual(dtable, expected));

  // And it is the right sum: at most 3 fp32 additions per element, 1e-6 abs.
  std::vector<double> reference(initial.begin(), initial.end());
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < kDim; ++i) {
      reference[ids[t] * kDim + i] += static_cast<double>(dout[t * kDim + i]);
    }
  }
  EXPECT_TRUE(AllClose(dtable, reference, 1e-6, 0.0));
  // Rows never referenced stay untouched.
  for (int64_t i = 0; i < kDim; ++i) EXPECT_EQ(dtable[50 * kDim + i], initial[50 * kDim + i]);
}

}  // namespace
}  // namespace megatrain::kernels::cpu
