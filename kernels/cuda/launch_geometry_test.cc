// Replays every CUDA launcher's grid on the CPU: each element must be visited
// exactly once (tails included) and the replayed thread bodies must give the
// kernels/common results.
#include "kernels/cuda/launch_geometry.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <vector>

#include "kernels/common/activations.h"
#include "kernels/common/rmsnorm.h"
#include "kernels/common/rope.h"
#include "kernels/cpu/residual.h"
#include "kernels/cuda/thread_bodies.h"

namespace megatrain::kernels::cuda {
namespace {

struct FloatStorage {
  using T = float;
  static float Load(float v) { return v; }
  static float Make(float v) { return v; }
};

const std::vector<int64_t> kSizes = {1, 31, 255, 256, 257, 1000, 1000003};

// Deterministic pseudo-random values in [-2, 2).
std::vector<float> Values(int64_t n, uint32_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  uint32_t state = seed * 2654435761u + 1u;
  for (auto& x : v) {
    state = state * 1664525u + 1013904223u;
    x = static_cast<float>(state >> 8) / static_cast<float>(1u << 24) * 4.0f - 2.0f;
  }
  return v;
}

// Calls f(index) for every thread of an element-wise launch of n elements,
// checks the grid is the smallest that covers n, and that every index < n is
// produced exactly once.
template <class F>
void ReplayElementwise(int64_t n, F f) {
  const LaunchShape shape = ElementwiseGrid(n);
  ASSERT_EQ(shape.blocks_y, 1);
  ASSERT_GE(shape.blocks_x * shape.threads, n);
  ASSERT_LT((shape.blocks_x - 1) * shape.threads, n) << "an entirely idle block";
  std::vector<uint8_t> seen(static_cast<size_t>(n), 0);
  for (int64_t block = 0; block < shape.blocks_x; ++block) {
    for (int thread = 0; thread < shape.threads; ++thread) {
      const int64_t i = ElementIndex(block, thread, shape.threads);
      if (i < n) ++seen[static_cast<size_t>(i)];
      f(i);
    }
  }
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[static_cast<size_t>(i)], 1) << "element " << i;
}

TEST(LaunchGeometryTest, ResidualAddVisitsEveryElementOnce) {
  for (int64_t n : kSizes) {
    SCOPED_TRACE(n);
    const auto a = Values(n, 1);
    const auto b = Values(n, 2);
    std::vector<float> out(static_cast<size_t>(n), NAN);
    ReplayElementwise(n, [&](int64_t i) {
      ResidualAddThread<FloatStorage>(i, n, a.data(), b.data(), out.data());
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], a[i] + b[i]) << i;
  }
}

// The device's gradient accumulation must equal the host's add bit for bit (the executor's
// accumulation on either side gives the same sums), -0.0 and subnormals included.
TEST(LaunchGeometryTest, AccumulateFp32IsTheHostAddBitForBit) {
  for (int64_t n : kSizes) {
    SCOPED_TRACE(n);
    auto g = Values(n, 6);
    std::vector<float> sum = Values(n, 7);
    if (n > 2) {
      g[0] = -0.0f;
      sum[0] = -0.0f;
      g[1] = 1e-40f;  // subnormal: no flush to zero on either side
      sum[1] = -3e-40f;
    }
    std::vector<float> want = sum;
    kernels::cpu::ResidualAdd(g.data(), n, want.data());
    ReplayElementwise(n, [&](int64_t i) { AccumulateFp32Thread(i, n, g.data(), sum.data()); });
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(sum[i]), std::bit_cast<uint32_t>(want[i])) << i;
    }
  }
}

TEST(LaunchGeometryTest, SwigluForwardAndBackwardMatchCommonMath) {
  for (int64_t n : kSizes) {
    SCOPED_TRACE(n);
    const auto gate = Values(n, 3);
    const auto up = Values(n, 4);
    const auto dy = Values(n, 5);
    std::vector<float> out(static_cast<size_t>(n), NAN);
    std::vector<float> d_gate(static_cast<size_t>(n), NAN);
    std::vector<float> d_up(static_cast<size_t>(n), NAN);
    ReplayElementwise(n, [&](int64_t i) {
      SwigluForwardThread<FloatStorage>(i, n, gate.data(), up.data(), out.data());
      SwigluBackwardThread<FloatStorage>(i, n, gate.data(), up.data(), dy.data(), d_gate.data(),
                                         d_up.data());
    });
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(out[i], SwigluForward(gate[i], up[i])) << i;
      float dg = 0.0f;
      float du = 0.0f;
      SwigluBackward(gate[i], up[i], dy[i], &dg, &du);
      ASSERT_EQ(d_gate[i], dg) << i;
      ASSERT_EQ(d_up[i], du) << i;
    }
  }
}

TEST(LaunchGeometryTest, EmbeddingForwardGathersEveryElementOnce) {
  const int64_t vocab = 37;
  for (int dim : {1, 31, 257}) {
    for (int64_t tokens : {1, 7, 301}) {
      SCOPED_TRACE(testing::Message() << "dim " << dim << " tokens " << tokens);
      const auto table = Values(vocab * dim, 6);
      std::vector<int32_t> ids(static_cast<size_t>(tokens));
      for (int64_t t = 0; t < tokens; ++t) ids[t] = static_cast<int32_t>((t * 11 + 3) % vocab);
      ids.back() = static_cast<int32_t>(vocab);  // out of range: poisoned row
      const int64_t n = tokens * dim;
      std::vector<float> out(static_cast<size_t>(n), 0.0f);
      ReplayElementwise(n, [&](int64_t i) {
        EmbeddingForwardThread<FloatStorage>(i, n, ids.data(), table.data(), vocab, dim,
                                             out.data());
      });
      for (int64_t t = 0; t + 1 < tokens; ++t) {
        for (int c = 0; c < dim; ++c) ASSERT_EQ(out[t * dim + c], table[ids[t] * dim + c]);
      }
      for (int c = 0; c < dim; ++c) ASSERT_TRUE(std::isnan(out[(tokens - 1) * dim + c]));
    }
  }
}

TEST(LaunchGeometryTest, EmbeddingBackwardOwnsEachRowColumnOnceInTokenOrder) {
  const int64_t vocab = 50;
  for (int dim : {1, 31, 257, 513}) {
    for (int64_t tokens : {1, 33, 1001}) {
      SCOPED_TRACE(testing::Message() << "dim " << dim << " tokens " << tokens);
      std::vector<int32_t> ids(static_cast<size_t>(tokens));
      for (int64_t t = 0; t < tokens; ++t) ids[t] = static_cast<int32_t>((t * t + 5) % vocab);
      // CSR by hand (the production builder has its own test).
      std::map<int32_t, std::vector<int32_t>> groups;
      for (int64_t t = 0; t < tokens; ++t) groups[ids[t]].push_back(static_cast<int32_t>(t));
      std::vector<int32_t> rows, offsets{0}, order;
      for (const auto& [row, members] : groups) {
        rows.push_back(row);
        order.insert(order.end(), members.begin(), members.end());
        offsets.push_back(static_cast<int32_t>(order.size()));
      }
      const auto dout = Values(tokens * dim, 7);
      const auto initial = Values(vocab * dim, 8);
      std::vector<float> dtable = initial;
      std::vector<int> visits(static_cast<size_t>(vocab * dim), 0);
      const LaunchShape shape = EmbeddingBackwardGrid(static_cast<int64_t>(rows.size()), dim);
      for (int64_t bx = 0; bx < shape.blocks_x; ++bx) {
        for (int64_t by = 0; by < shape.blocks_y; ++by) {
          for (int thread = 0; thread < shape.threads; ++thread) {
            const int64_t column = ColumnIndex(by, thread, shape.threads);
            if (column < dim) ++visits[rows[bx] * dim + column];
            EmbeddingBackwardThread<FloatStorage>(bx, column, rows.data(), offsets.data(),
                                                  order.data(), dout.data(), dim, dtable.data());
          }
        }
      }
      for (int64_t v = 0; v < vocab; ++v) {
        const bool used = groups.count(static_cast<int32_t>(v)) > 0;
        for (int c = 0; c < dim; ++c) {
          ASSERT_EQ(visits[v * dim + c], used ? 1 : 0);
          float expected_sum = 0.0f;  // token order, as the contract says
          if (used) {
            for (int32_t t : groups[static_cast<int32_t>(v)]) expected_sum += dout[t * dim + c];
          }
          ASSERT_EQ(dtable[v * dim + c],
                    used ? initial[v * dim + c] + expected_sum : initial[v * dim + c]);
        }
      }
    }
  }
}

// Tokens at t % seq, or (packed samples) at given positions restarting within the sequence.
TEST(LaunchGeometryTest, RopeRotatesEveryPairOnceAndBackwardInverts) {
  for (bool given_positions : {false, true})
  for (int head_dim : {2, 10, 64, 128}) {
    for (int64_t tokens : {1, 37, 301}) {
      const int heads = 3;
      const int seq = 7;
      const int half = head_dim / 2;
      SCOPED_TRACE(testing::Message() << "head_dim " << head_dim << " tokens " << tokens);
      std::vector<float> cos_table(static_cast<size_t>(seq * half));
      std::vector<float> sin_table(cos_table.size());
      for (int p = 0; p < seq; ++p) {
        for (int i = 0; i < half; ++i) {
          const double angle = p * RopeInverseFrequency(i, head_dim, 10000.0, RopeScaling{});
          cos_table[p * half + i] = static_cast<float>(std::cos(angle));
          sin_table[p * half + i] = static_cast<float>(std::sin(angle));
        }
      }
      std::vector<int32_t> positions(static_cast<size_t>(tokens));
      for (int64_t t = 0; t < tokens; ++t) positions[t] = static_cast<int32_t>((t * 5 + 3) % seq);
      const int32_t* pos = given_positions ? positions.data() : nullptr;
      const int64_t n = tokens * heads * head_dim;
      const auto original = Values(n, 9);
      std::vector<float> x = original;
      std::vector<int> visits(static_cast<size_t>(n), 0);
      const int64_t pairs = tokens * heads * half;
      ReplayElementwise(pairs, [&](int64_t pair) {
        if (pair < pairs) {
          const int64_t lo = RopeLowOffset(RopePairAt(pair, heads, half), heads, head_dim);
          ++visits[lo];
          ++visits[lo + half];
        }
        RopeThread<FloatStorage>(pair, pairs, x.data(), heads, head_dim, seq, cos_table.data(),
                                 sin_table.data(), pos, /*backward=*/false);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(visits[i], 1) << i;
      for (int64_t t = 0; t < tokens; ++t) {
        for (int h = 0; h < heads; ++h) {
          for (int i = 0; i < half; ++i) {
            const int64_t lo = (t * heads + h) * head_dim + i;
            const int64_t angle = (given_positions ? positions[t] : t % seq) * half + i;
            float lo_out = 0.0f;
            float hi_out = 0.0f;
            RopeRotate(original[lo], original[lo + half], cos_table[angle], sin_table[angle],
                       &lo_out, &hi_out);
            ASSERT_EQ(x[lo], lo_out);
            ASSERT_EQ(x[lo + half], hi_out);
          }
        }
      }
      ReplayElementwise(pairs, [&](int64_t pair) {
        RopeThread<FloatStorage>(pair, pairs, x.data(), heads, head_dim, seq, cos_table.data(),
                                 sin_table.data(), pos, /*backward=*/true);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(x[i], original[i], 1e-5f) << i;
    }
  }
}

TEST(LaunchGeometryTest, RowGridVisitsEveryColumnOncePerRow) {
  for (int64_t cols : {int64_t{1}, int64_t{31}, int64_t{256}, int64_t{257}, int64_t{1000003}}) {
    SCOPED_TRACE(cols);
    const LaunchShape shape = RowGrid(5);
    ASSERT_EQ(shape.blocks_x, 5);
    std::vector<uint8_t> seen(static_cast<size_t>(cols), 0);
    for (int thread = 0; thread < shape.threads; ++thread) {
      for (int64_t c = RowFirstColumn(thread); c < cols; c += RowColumnStride(shape.threads)) {
        ++seen[c];
      }
    }
    for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(seen[c], 1) << c;
  }
}

TEST(LaunchGeometryTest, RmsnormDwPartialsCoverEveryRowOnceAndMatchReference) {
  for (int64_t rows : {1, 63, 64, 65, 301}) {
    for (int dim : {1, 31, 257}) {
      SCOPED_TRACE(testing::Message() << "rows " << rows << " dim " << dim);
      const auto x = Values(rows * dim, 10);
      const auto dy = Values(rows * dim, 11);
      std::vector<float> rstd(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) rstd[r] = 0.5f + 0.01f * static_cast<float>(r % 13);

      // Every row belongs to exactly one group.
      std::vector<int> row_seen(static_cast<size_t>(rows), 0);
      for (int64_t g = 0; g < DwRowGroups(rows); ++g) {
        const RowRange range = DwGroupRows(g, rows);
        for (int64_t r = range.begin; r < range.end; ++r) ++row_seen[r];
      }
      for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(row_seen[r], 1) << r;

      const int64_t groups = DwRowGroups(rows);
      std::vector<float> partials(static_cast<size_t>(groups * dim), NAN);
      std::vector<int> written(partials.size(), 0);
      const LaunchShape pass1 = DwPartialGrid(rows, dim);
      ASSERT_EQ(pass1.blocks_y, groups);
      for (int64_t bx = 0; bx < pass1.blocks_x; ++bx) {
        for (int64_t g = 0; g < pass1.blocks_y; ++g) {
          for (int thread = 0; thread < pass1.threads; ++thread) {
            const int64_t column = ColumnIndex(bx, thread, pass1.threads);
            if (column < dim) ++written[g * dim + column];
            RmsnormDwPartialThread<FloatStorage>(g, column, rows, dim, x.data(), dy.data(),
                                                 rstd.data(), partials.data());
          }
        }
      }
      for (size_t i = 0; i < written.size(); ++i) ASSERT_EQ(written[i], 1) << i;

      std::vector<float> dw(static_cast<size_t>(dim), 1.0f);  // accumulates onto 1
      const LaunchShape pass2 = DwFinalGrid(dim);
      for (int64_t bx = 0; bx < pass2.blocks_x; ++bx) {
        for (int thread = 0; thread < pass2.threads; ++thread) {
          RmsnormDwFinalThread(ColumnIndex(bx, thread, pass2.threads), groups, dim, partials.data(),
                               dw.data());
        }
      }
      for (int c = 0; c < dim; ++c) {
        double expected = 0.0;
        for (int64_t r = 0; r < rows; ++r) {
          expected += RmsnormBackwardWeight(x[r * dim + c], dy[r * dim + c], rstd[r]);
        }
        ASSERT_NEAR(dw[c], 1.0 + expected, 1e-4 * (1.0 + std::abs(expected))) << c;
      }
    }
  }
}

TEST(LaunchGeometryTest, AttentionSlotsCoverEveryRowDimAndCausalKey) {
  for (int seq : {1, 15, 16, 17, 33, 100}) {
    for (int head_dim : {64, 128}) {
      SCOPED_TRACE(testing::Message() << "seq " << seq << " head_dim " << head_dim);
      const int batch = 2;
      const int heads = 3;
      const LaunchShape shape = AttentionGrid(seq, batch, heads);
      ASSERT_EQ(shape.blocks_y, batch * heads);
      ASSERT_EQ(shape.threads, kAttnThreads);
      // One (b, h) slice: every (row, dim) owned by exactly one (thread, e).
      std::vector<int> owned(static_cast<size_t>(seq * head_dim), 0);
      for (int64_t bx = 0; bx < shape.blocks_x; ++bx) {
        const int first_row = static_cast<int>(bx * kAttnRowsPerBlock);
        const int key_end = CausalKeyEnd(first_row, kAttnRowsPerBlock, seq);
        // Tiles loaded from 0 in kAttnTile steps cover every key a row of this
        // block may see, and nothing past the sequence is visible.
        int covered = 0;
        for (int k0 = 0; k0 < key_end; k0 += kAttnTile) covered = k0 + kAttnTile;
        for (int thread = 0; thread < shape.threads; ++thread) {
          const AttnRowSlot slot = AttentionRowSlot(bx, thread);
          if (slot.row >= seq) continue;
          ASSERT_GE(covered, slot.row + 1);
          for (int e = 0; e < head_dim / kAttnThreadsPerRow; ++e) {
            ++owned[slot.row * head_dim + slot.lane + kAttnThreadsPerRow * e];
          }
        }
      }
      for (size_t i = 0; i < owned.size(); ++i) ASSERT_EQ(owned[i], 1) << i;
      // Offsets of distinct (b, s, h) never overlap.
      ASSERT_EQ(BshdOffset(1, 0, 0, seq, heads, head_dim),
                static_cast<int64_t>(seq) * heads * head_dim);
    }
  }
}

}  // namespace
}  // namespace megatrain::kernels::cuda
