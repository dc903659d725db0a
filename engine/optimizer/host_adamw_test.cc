// Tests for HostAdamw and AdamwRange: bit-exactness of every SIMD body against
// kernels::AdamwUpdate, segments, bf16 compute copy, thread-count
// independence, and agreement with a double-precision torch AdamW.
#include "engine/optimizer/host_adamw.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "engine/optimizer/adamw_range.h"
#include "gtest/gtest.h"
#include "kernels/common/adamw.h"
#include "kernels/common/bf16.h"

namespace megatrain::engine {
namespace {

using kernels::AdamwStepScalars;
using kernels::MakeAdamwStepScalars;

std::vector<SimdIsa> SupportedIsas() {
  std::vector<SimdIsa> isas;
  for (SimdIsa isa : {SimdIsa::kScalar, SimdIsa::kAvx2, SimdIsa::kAvx512}) {
    if (SimdIsaSupported(isa)) isas.push_back(isa);
  }
  return isas;
}

struct State {
  std::vector<float> param, m, v, grad;
  std::vector<uint16_t> bf16;

  explicit State(size_t n, uint32_t seed) : param(n), m(n), v(n), grad(n), bf16(n, 0xdead) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    std::uniform_real_distribution<float> exponent(-12.0f, 3.0f);
    for (size_t i = 0; i < n; ++i) {
      param[i] = unit(rng);
      m[i] = 0.1f * unit(rng);
      v[i] = std::fabs(unit(rng)) * 1e-2f;
      // Gradients over many magnitudes, with exact zeros now and then.
      grad[i] = (i % 97 == 3) ? 0.0f : unit(rng) * std::pow(10.0f, exponent(rng));
    }
  }
};

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void ExpectSameState(const State& got, const State& want, const std::string& what) {
  EXPECT_TRUE(SameBits(got.param, want.param)) << what << ": param";
  EXPECT_TRUE(SameBits(got.m, want.m)) << what << ": m";
  EXPECT_TRUE(SameBits(got.v, want.v)) << what << ": v";
  EXPECT_EQ(got.bf16, want.bf16) << what << ": bf16";
}

AdamwStepScalars DecayScalars(long long step) {
  return MakeAdamwStepScalars(3e-3, 0.9, 0.95, 1e-8, 0.1, step, 0.37);
}
AdamwStepScalars NoDecayScalars(long long step) {
  return MakeAdamwStepScalars(3e-3, 0.9, 0.95, 1e-8, 0.0, step, 0.37);
}

// The reference: kernels::AdamwUpdate element by element, in this file
// (compiled with -ffp-contract=off, as the shared formula requires on the CPU).
void ReferenceStep(const AdamwStepScalars& s, size_t begin, size_t count, State& st,
                   bool with_bf16) {
  for (size_t i = begin; i < begin + count; ++i) {
    kernels::AdamwUpdate(s, st.grad[i], &st.param[i], &st.m[i], &st.v[i]);
    if (with_bf16) st.bf16[i] = kernels::Float32ToBf16Bits(st.param[i]);
  }
}

TEST(AdamwRangeTest, EverySimdBodyMatchesTheSharedFormulaBitForBit) {
  for (size_t n : {1, 7, 15, 16, 17, 33, 1000, 1000003}) {
    for (bool with_bf16 : {false, true}) {
      for (long long step : {1LL, 2LL, 1000LL}) {
        State want(n, static_cast<uint32_t>(n));
        ReferenceStep(DecayScalars(step), 0, n, want, with_bf16);
        for (SimdIsa isa : SupportedIsas()) {
          State got(n, static_cast<uint32_t>(n));
          AdamwRange(isa, DecayScalars(step), n, got.param.data(), got.m.data(), got.v.data(),
                     got.grad.data(), with_bf16 ? got.bf16.data() : nullptr);
          ExpectSameState(got, want,
                          std::string(SimdIsaName(isa)) + " n=" + std::to_string(n) + " bf16=" +
                              std::to_string(with_bf16) + " step=" + std::to_string(step));
        }
      }
    }
  }
}

// The speculative update's out-of-place form: every body, with and without the bf16 copy, at
// odd sizes (vector bodies plus scalar tails), gives the in-place bits and leaves its inputs as
// they were. The power-of-two step (t = 1000 at beta2 0.95) takes the reciprocal path.
TEST(AdamwRangeTest, OutOfPlaceGivesTheInPlaceBitsAndLeavesItsInputs) {
  for (size_t n : {1, 7, 15, 17, 31, 33, 1001, 65537}) {
    for (bool with_bf16 : {false, true}) {
      for (long long step : {1LL, 1000LL}) {
        for (SimdIsa isa : SupportedIsas()) {
          const std::string what = std::string(SimdIsaName(isa)) + " n=" + std::to_string(n) +
                                   " bf16=" + std::to_string(with_bf16) +
                                   " step=" + std::to_string(step);
          const State initial(n, static_cast<uint32_t>(n + 5));
          State in_place = initial;
          AdamwRange(isa, DecayScalars(step), n, in_place.param.data(), in_place.m.data(),
                     in_place.v.data(), in_place.grad.data(),
                     with_bf16 ? in_place.bf16.data() : nullptr);
          State current = initial;
          State out(n, 1);  // other values, all overwritten
          AdamwArrays arrays{current.param.data(), current.m.data(), current.v.data(),
                             out.param.data(),     out.m.data(),     out.v.data()};
          AdamwRangeTo(isa, DecayScalars(step), n, arrays, current.grad.data(),
                       with_bf16 ? out.bf16.data() : nullptr);
          out.grad = in_place.grad;
          if (!with_bf16) out.bf16 = in_place.bf16;
          ExpectSameState(out, in_place, what + " (new state)");
          ExpectSameState(current, initial, what + " (inputs)");
        }
      }
    }
  }
}

// HostAdamw::StepTo over segments with gaps, on several threads: the in-place bits, inputs
// untouched, and the outputs' gaps not written.
TEST(HostAdamwTest, StepToGivesStepsBitsOutOfPlace) {
  const size_t n = 3 * HostAdamw::kChunkElements + 4099;
  const std::vector<AdamwSegment> segments = {
      {0, 1001, true}, {1003, HostAdamw::kChunkElements + 17, false}, {20000, n - 20001, true}};
  ThreadPool pool(3);
  const HostAdamw adamw(&pool);
  const State initial(n, 42);
  State in_place = initial;
  adamw.Step(DecayScalars(3), NoDecayScalars(3), segments, in_place.param.data(),
             in_place.m.data(), in_place.v.data(), in_place.grad.data(), in_place.bf16.data());
  State current = initial;
  State out = initial;  // the gaps keep these values
  for (const AdamwSegment& seg : segments) {
    for (size_t i = seg.offset; i < seg.offset + seg.count; ++i) out.param[i] = out.m[i] = -7.0f;
  }
  AdamwArrays arrays{current.param.data(), current.m.data(), current.v.data(),
                     out.param.data(),     out.m.data(),     out.v.data()};
  adamw.StepTo(DecayScalars(3), NoDecayScalars(3), segments, arrays, current.grad.data(),
               out.bf16.data());
  ExpectSameState(out, in_place, "StepTo");
  ExpectSameState(current, initial, "StepTo inputs");
}

// Same bits, or both NaN (NaN payloads may legitimately differ when two NaN
// operands meet in an addition the compiler commutes).
bool SameBitsOrBothNan(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return false;
  }
  return true;
}

TEST(AdamwRangeTest, PowerOfTwoBiasCorrectionMatchesDivisionForEveryKindOfValue) {
  // Vector bodies multiply by the reciprocal when sqrt(1 - beta2^t) is a
  // power of two; the reference divides. Special values of v and grad push
  // sqrt(v) through zero, tiny, huge, infinite and NaN; 2^-100 and 2^100 push
  // the scaled root into overflow and subnormals. Non-powers of two (next to
  // 1.0f and 0.5f) take the division path.
  const uint32_t special_bits[] = {0x00000000, 0x00000001, 0x00000123, 0x007fffff, 0x00800000,
                                   0x3f800000, 0x7f7fffff, 0x7f800000, 0x7fc00000, 0x1e3ce508,
                                   0x5f000000, 0x3a83126f, 0x80000000};
  const size_t n = 7 * 16 + 13;
  std::vector<float> special(std::size(special_bits));
  for (size_t i = 0; i < special.size(); ++i) std::memcpy(&special[i], &special_bits[i], 4);
  const float bc2_values[] = {1.0f,
                              0.5f,
                              4.0f,
                              std::ldexp(1.0f, -100),
                              std::ldexp(1.0f, 100),
                              std::nextafter(1.0f, 0.0f),
                              std::nextafter(0.5f, 1.0f)};
  for (float bc2 : bc2_values) {
    AdamwStepScalars s = DecayScalars(4);
    s.bias_correction2_sqrt = bc2;
    State want(n, 77);
    for (size_t i = 0; i < n; ++i) {
      if (i % 3 == 0) want.v[i] = std::fabs(special[(i / 3) % special.size()]);
      if (i % 5 == 1) want.grad[i] = special[(i / 5) % special.size()];
    }
    const State initial = want;
    ReferenceStep(s, 0, n, want, true);
    for (SimdIsa isa : SupportedIsas()) {
      State got = initial;
      AdamwRange(isa, s, n, got.param.data(), got.m.data(), got.v.data(), got.grad.data(),
                 got.bf16.data());
      const std::string what = std::string(SimdIsaName(isa)) + " bc2=" + std::to_string(bc2);
      EXPECT_TRUE(SameBitsOrBothNan(got.param, want.param)) << what << ": param";
      EXPECT_TRUE(SameBitsOrBothNan(got.m, want.m)) << what << ": m";
      EXPECT_TRUE(SameBitsOrBothNan(got.v, want.v)) << what << ": v";
    }
  }
}

TEST(AdamwRangeTest, AnyAlignmentMatches) {
  // Shifts of 0, 8 and 16 elements put the compute copy on 64, 16 and 32
  // byte boundaries (streaming or ordinary stores); odd shifts on none.
  const size_t n = 1001;
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  for (size_t shift : {0, 1, 3, 5, 8, 16}) {
    State want(n + shift, 11);
    ReferenceStep(DecayScalars(3), shift, n, want, true);
    for (SimdIsa isa : SupportedIsas()) {
      State got(n + shift, 11);
      std::unique_ptr<uint16_t, Free> copy(
          static_cast<uint16_t*>(std::aligned_alloc(64, 64 * ((n + shift) * 2 / 64 + 1))));
      std::copy(got.bf16.begin(), got.bf16.end(), copy.get());
      AdamwRange(isa, DecayScalars(3), n, got.param.data() + shift, got.m.data() + shift,
                 got.v.data() + shift, got.grad.data() + shift, copy.get() + shift);
      std::copy(copy.get(), copy.get() + n + shift, got.bf16.begin());
      ExpectSameState(got, want, std::string(SimdIsaName(isa)) + " shift=" + std::to_string(shift));
    }
  }
}

// Independent bf16 rounding: pick the nearer of the two bf16 neighbours by
// exact integer distance, ties to the even one.
uint16_t ReferenceBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if (std::isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  const uint32_t down = bits >> 16;
  const uint32_t rest = bits & 0xffff;
  if (rest < 0x8000) return static_cast<uint16_t>(down);
  if (rest > 0x8000) return static_cast<uint16_t>(down + 1);
  return static_cast<uint16_t>((down & 1) ? down + 1 : down);
}

TEST(AdamwRangeTest, ComputeCopyIsRoundToNearestEvenOfTheNewParam) {
  // lr = 0 and step_size = 0 with zero m and grad leave param unchanged, so
  // the copy must be the rounding of the chosen input bit patterns.
  const uint32_t patterns[] = {
      0x3f800000, 0x3f808000, 0x3f818000, 0x3f807fff, 0x3f808001, 0xbf808000, 0xbf818000,
      0x7f7fffff, 0xff7fffff, 0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001, 0xffa00000,
      0x00000001, 0x00008000, 0x00018000, 0x80000000, 0x00000000, 0x477fe000, 0x3eaaaaab};
  const size_t n = 3 * 16 + 5;
  std::vector<float> base(n);
  for (size_t i = 0; i < n; ++i) std::memcpy(&base[i], &patterns[i % std::size(patterns)], 4);
  AdamwStepScalars still;  // lr = 0, step_size = 0
  for (SimdIsa isa : SupportedIsas()) {
    std::vector<float> param = base, m(n, 0.0f), v(n, 0.0f), grad(n, 0.0f);
    std::vector<uint16_t> bf16(n, 0);
    AdamwRange(isa, still, n, param.data(), m.data(), v.data(), grad.data(), bf16.data());
    for (size_t i = 0; i < n; ++i) {
      uint32_t in_bits, out_bits;
      std::memcpy(&in_bits, &base[i], 4);
      std::memcpy(&out_bits, &param[i], 4);
      if (!std::isnan(base[i])) {
        ASSERT_EQ(out_bits, in_bits) << SimdIsaName(isa) << " i=" << i;
      }
      ASSERT_EQ(bf16[i], ReferenceBf16(param[i]))
          << SimdIsaName(isa) << " i=" << i << " bits=" << std::hex << in_bits;
    }
  }
}

std::vector<AdamwSegment> OddSegments() {
  // A packed layer with odd offsets and sizes, decayed matrices and
  // undecayed norms, and gaps (elements that must stay untouched).
  return {{0, 1, false},         {1, 15, true},         {17, 17, false},   {34, 100003, true},
          {100037, 4099, false}, {104140, 70001, true}, {174141, 0, true}, {174143, 33, false}};
}

constexpr size_t kOddBufferSize = 174143 + 33 + 3;

TEST(HostAdamwTest, SegmentsUseTheirScalarsAndLeaveGapsUntouched) {
  const std::vector<AdamwSegment> segments = OddSegments();
  for (bool with_bf16 : {false, true}) {
    State want(kOddBufferSize, 5);
    for (const AdamwSegment& s : segments) {
      ReferenceStep(s.weight_decay ? DecayScalars(7) : NoDecayScalars(7), s.offset, s.count, want,
                    with_bf16);
    }
    for (SimdIsa isa : SupportedIsas()) {
      ThreadPool pool(2);
      HostAdamw adamw(&pool, isa);
      EXPECT_EQ(adamw.isa(), isa);
      State got(kOddBufferSize, 5);
      adamw.Step(DecayScalars(7), NoDecayScalars(7), segments, got.param.data(), got.m.data(),
                 got.v.data(), got.grad.data(), with_bf16 ? got.bf16.data() : nullptr);
      ExpectSameState(got, want,
                      std::string(SimdIsaName(isa)) + " bf16=" + std::to_string(with_bf16));
    }
  }
  // The gaps really are gaps: untouched params equal their initial values.
  State initial(kOddBufferSize, 5), after(kOddBufferSize, 5);
  HostAdamw(nullptr).Step(DecayScalars(7), NoDecayScalars(7), segments, after.param.data(),
                          after.m.data(), after.v.data(), after.grad.data(), after.bf16.data());
  for (size_t gap : {size_t{16}, size_t{174141}, size_t{174142}, kOddBufferSize - 1}) {
    EXPECT_EQ(after.param[gap], initial.param[gap]) << gap;
    EXPECT_EQ(after.bf16[gap], 0xdead) << gap;
  }
  EXPECT_NE(after.param[17], initial.param[17]);
}

TEST(HostAdamwTest, DecayFlagMatters) {
  const std::vector<AdamwSegment> decayed = {{0, 1001, true}};
  const std::vector<AdamwSegment> undecayed = {{0, 1001, false}};
  State a(1001, 9), b(1001, 9);
  HostAdamw adamw(nullptr);
  adamw.Step(DecayScalars(1), NoDecayScalars(1), decayed, a.param.data(), a.m.data(), a.v.data(),
             a.grad.data(), nullptr);
  adamw.Step(DecayScalars(1), NoDecayScalars(1), undecayed, b.param.data(), b.m.data(), b.v.data(),
             b.grad.data(), nullptr);
  EXPECT_FALSE(SameBits(a.param, b.param));
  EXPECT_TRUE(SameBits(a.m, b.m));
}

TEST(HostAdamwTest, ResultsDoNotDependOnThreadCount) {
  // Long enough that each thread count cuts different blocks of several
  // chunks, with segment edges inside blocks.
  const size_t n = 41 * HostAdamw::kChunkElements + 12345;
  const std::vector<AdamwSegment> segments = {
      {0, 5, false},
      {5, HostAdamw::kChunkElements + 3, true},
      {HostAdamw::kChunkElements + 8, n - HostAdamw::kChunkElements - 8, true}};
  State want(n, 21);
  HostAdamw(nullptr).Step(DecayScalars(2), NoDecayScalars(2), segments, want.param.data(),
                          want.m.data(), want.v.data(), want.grad.data(), want.bf16.data());
  for (size_t threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    State got(n, 21);
    HostAdamw(&pool).Step(DecayScalars(2), NoDecayScalars(2), segments, got.param.data(),
                          got.m.data(), got.v.data(), got.grad.data(), got.bf16.data());
    ExpectSameState(got, want, "threads=" + std::to_string(threads));
  }
}

// torch.optim.AdamW (single-tensor, amsgrad off), all in double.
struct DoubleAdamw {
  double lr, beta1, beta2, eps, weight_decay;
  std::vector<double> p, m, v;
  void Step(long long t, const std::vector<double>& g) {
    const double bc1 = 1.0 - std::pow(beta1, double(t));
    const double bc2_sqrt = std::sqrt(1.0 - std::pow(beta2, double(t)));
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1.0 - lr * weight_decay;
      m[i] = beta1 * m[i] + (1.0 - beta1) * g[i];
      v[i] = beta2 * v[i] + (1.0 - beta2) * g[i] * g[i];
      p[i] -= (lr / bc1) * m[i] / (std::sqrt(v[i]) / bc2_sqrt + eps);
    }
  }
};

TEST(HostAdamwTest, TwentyStepsMatchDoublePrecisionTorchAdamw) {
  // Tolerance: each float step rounds p (<= 2^-24 |p| per operation, a few
  // per step) and the update (a few ulps of |update| <= ~lr * 4); over 20
  // steps that stays below 4e-6 |p| + 20 * 4 * lr * 2^-20 ~= 4e-6 |p| + 2e-7.
  const size_t n = 10007;
  const int steps = 20;
  const double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, wd = 0.1;
  const std::vector<AdamwSegment> segments = {{0, 5003, true}, {5003, n - 5003, false}};
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::vector<float> param(n), m(n, 0.0f), v(n, 0.0f), grad(n);
  for (float& p : param) p = unit(rng);
  const std::vector<float> initial = param;
  DoubleAdamw decayed{lr, beta1, beta2, eps, wd, {}, {}, {}};
  DoubleAdamw undecayed{lr, beta1, beta2, eps, 0.0, {}, {}, {}};
  decayed.p.assign(param.begin(), param.begin() + 5003);
  undecayed.p.assign(param.begin() + 5003, param.end());
  decayed.m.assign(5003, 0.0);
  decayed.v.assign(5003, 0.0);
  undecayed.m.assign(n - 5003, 0.0);
  undecayed.v.assign(n - 5003, 0.0);
  ThreadPool pool(2);
  HostAdamw adamw(&pool);
  for (int t = 1; t <= steps; ++t) {
    for (size_t i = 0; i < n; ++i) grad[i] = unit(rng) * std::pow(10.0f, float(i % 7) - 5.0f);
    adamw.Step(MakeAdamwStepScalars(lr, beta1, beta2, eps, wd, t, 1.0),
               MakeAdamwStepScalars(lr, beta1, beta2, eps, 0.0, t, 1.0), segments, param.data(),
               m.data(), v.data(), grad.data(), nullptr);
    decayed.Step(t, std::vector<double>(grad.begin(), grad.begin() + 5003));
    undecayed.Step(t, std::vector<double>(grad.begin() + 5003, grad.end()));
  }
  double max_error = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double want = i < 5003 ? decayed.p[i] : undecayed.p[i - 5003];
    const double error = std::fabs(double(param[i]) - want);
    max_error = std::max(max_error, error / (std::fabs(want) + 0.05));
    ASSERT_LE(error, 4e-6 * std::fabs(want) + 2e-7) << "i=" << i;
  }
  // The run really moved the parameters (Adam steps are about lr each).
  double moved = 0.0;
  for (size_t i = 0; i < n; ++i) moved += std::fabs(double(param[i]) - initial[i]);
  EXPECT_GT(moved / n, 2.0 * lr);
  EXPECT_LT(max_error, 1e-5);
}

}  // namespace
}  // namespace megatrain::engine
