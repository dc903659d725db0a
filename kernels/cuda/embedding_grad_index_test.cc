// BuildEmbeddingGradIndex: grouping, ordering and input validation.
#include "kernels/cuda/embedding_grad_index.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

namespace megatrain::kernels::cuda {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(EmbeddingGradIndexTest, GroupsTokensByIdInTokenOrder) {
  const std::vector<int32_t> ids = {5, 2, 5, 0, 2, 5, 9};
  auto index = BuildEmbeddingGradIndex(ids, 11);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_THAT(index->unique_rows, ElementsAre(0, 2, 5, 9));
  EXPECT_THAT(index->segment_offsets, ElementsAre(0, 1, 3, 6, 7));
  EXPECT_THAT(index->token_order, ElementsAre(3, 1, 4, 0, 2, 5, 6));
}

TEST(EmbeddingGradIndexTest, EveryTokenAppearsOnceForOddSizes) {
  for (int tokens : {1, 31, 257, 4099}) {
    std::vector<int32_t> ids(static_cast<size_t>(tokens));
    for (int t = 0; t < tokens; ++t) ids[t] = (t * 7919) % 97;
    auto index = BuildEmbeddingGradIndex(ids, 97);
    ASSERT_TRUE(index.ok());
    std::vector<int> seen(static_cast<size_t>(tokens), 0);
    for (size_t u = 0; u < index->unique_rows.size(); ++u) {
      for (int32_t k = index->segment_offsets[u]; k < index->segment_offsets[u + 1]; ++k) {
        const int32_t t = index->token_order[k];
        ++seen[t];
        EXPECT_EQ(ids[t], index->unique_rows[u]);
        if (k > index->segment_offsets[u]) {
          EXPECT_LT(index->token_order[k - 1], t);
        }
      }
    }
    for (int t = 0; t < tokens; ++t) EXPECT_EQ(seen[t], 1) << t;
  }
}

TEST(EmbeddingGradIndexTest, RejectsOutOfRangeIdNamingIt) {
  const std::vector<int32_t> ids = {1, 2, 40};
  auto index = BuildEmbeddingGradIndex(ids, 40);
  ASSERT_FALSE(index.ok());
  EXPECT_EQ(index.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(index.status().message(), HasSubstr("ids[2] = 40"));
  EXPECT_FALSE(BuildEmbeddingGradIndex(std::vector<int32_t>{-1}, 4).ok());
  EXPECT_FALSE(BuildEmbeddingGradIndex(std::vector<int32_t>{0}, 0).ok());
}

TEST(EmbeddingGradIndexTest, EmptyBatchGivesEmptyIndex) {
  auto index = BuildEmbeddingGradIndex({}, 3);
  ASSERT_TRUE(index.ok());
  EXPECT_TRUE(index->unique_rows.empty());
  EXPECT_THAT(index->segment_offsets, ElementsAre(0));
}

}  // namespace
}  // namespace megatrain::kernels::cuda
