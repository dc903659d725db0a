// Tests the host embedding stages against a zeroed-buffer scatter followed by
// a copy or an add (the device-side formulation), bit for bit.
#include "engine/exec/host_embedding.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/common/bf16.h"
#include "kernels/cpu/embedding.h"

namespace megatrain::engine {
namespace {

TEST(HostEmbeddingTest, GatherCopiesTheRowsOfTheIds) {
  const int64_t vocab = 11, dim = 7;
  std::vector<float> table(vocab * dim);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<float>(i) * 0.5f;
  const std::vector<int32_t> ids = {3, 10, 3, 0, 5};
  std::vector<float> rows(ids.size() * dim);
  GatherEmbeddingRows(table.data(), vocab, dim, ids.data(), static_cast<int64_t>(ids.size()),
                      rows.data());
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t j = 0; j < dim; ++j) EXPECT_EQ(rows[t * dim + j], table[ids[t] * dim + j]);
}

// Against the device-side formulation: a scatter into a zeroed buffer (token order), then a
// copy (first contribution) or an add into the slab, bit for bit.
void ExpectScatterMatchesZeroedScatter(int64_t vocab, int64_t dim, int64_t tokens, int distinct,
                                       unsigned threads = 0) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> id(0, vocab - 1);
  std::normal_distribution<float> value(0.0f, 1.0f);
  std::vector<int32_t> ids(tokens);
  for (auto& i : ids) i = id(rng) % distinct;  // few distinct ids: long groups
  std::vector<float> d_rows(tokens * dim), slab(vocab * dim);
  for (auto& v : d_rows) v = value(rng) * 1e3f;
  for (auto& v : slab) v = value(rng);

  std::vector<float> zeroed(vocab * dim, 0.0f);
  kernels::cpu::EmbeddingBackward(d_rows.data(), ids.data(), tokens, vocab, dim, zeroed.data());

  std::vector<float> first(vocab * dim, 42.0f);
  ScatterAddEmbeddingRows(d_rows.data(), ids.data(), tokens, vocab, dim, true, first.data(),
                          threads);
  EXPECT_EQ(std::memcmp(first.data(), zeroed.data(), first.size() * sizeof(float)), 0);

  std::vector<float> expected = slab;
  for (size_t i = 0; i < expected.size(); ++i) expected[i] += zeroed[i];
  std::vector<float> added = slab;
  ScatterAddEmbeddingRows(d_rows.data(), ids.data(), tokens, vocab, dim, false, added.data(),
                          threads);
  EXPECT_EQ(std::memcmp(added.data(), expected.data(), added.size() * sizeof(float)), 0);
}

TEST(HostEmbeddingTest, ScatterMatchesZeroedScatterThenCopyOrAdd) {
  ExpectScatterMatchesZeroedScatter(37, 13, 101, 9);  // repeated ids, odd sizes
}

// Over 1M floats of rows the id groups are split over threads: still the same bits.
TEST(HostEmbeddingTest, ThreadedScatterMatchesZeroedScatter) {
  for (unsigned threads : {1u, 2u, 3u, 8u}) {
    SCOPED_TRACE(threads);
    ExpectScatterMatchesZeroedScatter(523, 401, 3001, 97, threads);
    ExpectScatterMatchesZeroedScatter(523, 401, 3001, 2, threads);  // two huge groups
  }
}

// bf16 rows widened as they are summed: the bits of widening them first, then the fp32
// scatter, threaded or not, first contribution or added.
TEST(HostEmbeddingTest, Bf16ScatterMatchesWidenedFp32Scatter) {
  const int64_t vocab = 523, dim = 401, tokens = 3001;  // over 1M floats: threaded
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> id(0, 96);
  std::normal_distribution<float> value(0.0f, 1.0f);
  std::vector<int32_t> ids(tokens);
  for (auto& i : ids) i = id(rng);
  std::vector<uint16_t> bf16(tokens * dim);
  std::vector<float> widened(bf16.size());
  for (size_t i = 0; i < bf16.size(); ++i) {
    bf16[i] = kernels::Float32ToBf16Bits(value(rng) * 100.0f);
    widened[i] = kernels::Bf16BitsToFloat32(bf16[i]);
  }
  std::vector<float> slab(vocab * dim);
  for (auto& v : slab) v = value(rng);
  for (const bool first : {true, false}) {
    for (const unsigned threads : {1u, 3u, 8u}) {
      SCOPED_TRACE(::testing::Message() << "first " << first << ", threads " << threads);
      std::vector<float> want = slab, got = slab;
      ScatterAddEmbeddingRows(widened.data(), ids.data(), tokens, vocab, dim, first, want.data(),
                              threads);
      ScatterAddEmbeddingRowsBf16(bf16.data(), ids.data(), tokens, vocab, dim, first, got.data(),
                                  threads);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
    }
  }
}

// A table over 64 MiB is cleared in parallel chunks: every row but the
// tokens' becomes zero, the last chunk's tail included.
TEST(HostEmbeddingTest, FirstContributionClearsALargeTable) {
  const int64_t vocab = 4099, dim = 4099, tokens = 5;  // 67.2 MB, odd: uneven chunks
  const std::vector<int32_t> ids = {0, 4098, 17, 4098, 2050};
  std::vector<float> d_rows(tokens * dim);
  for (size_t i = 0; i < d_rows.size(); ++i) d_rows[i] = static_cast<float>(i % 97) + 1.0f;
  std::vector<float> zeroed(vocab * dim, 0.0f);
  kernels::cpu::EmbeddingBackward(d_rows.data(), ids.data(), tokens, vocab, dim, zeroed.data());
  std::vector<float> first(vocab * dim, 42.0f);
  for (unsigned threads : {1u, 3u, 8u}) {
    std::fill(first.begin(), first.end(), 42.0f);
    ScatterAddEmbeddingRows(d_rows.data(), ids.data(), tokens, vocab, dim, true, first.data(),
                            threads);
    EXPECT_EQ(std::memcmp(first.data(), zeroed.data(), first.size() * sizeof(float)), 0)
        << threads << " threads";
  }
  EXPECT_EQ(first.back(), zeroed.back());
  EXPECT_EQ(first[1 * dim], 0.0f);
}

}  // namespace
}  // namespace megatrain::engine
