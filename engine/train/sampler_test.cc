// Tests for the sampler: greedy generation from the llama_tiny golden fixture
// equals an argmax over Trainer::Logits computed here, top-p -> 0 is greedy,
// a seed fixes the sampled tokens, and greedy replies to several prompts, one
// per micro-batch row, are each prompt's own greedy reply, cut at its stop token; a
// generation asked to stop (SamplingOptions::interrupted) ends before its next forward.
#include "engine/train/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "engine/device/cpu_device.h"
#include "engine/model/model_config.h"

namespace megatrain::engine {
namespace {

constexpr int kContext = 13;  // odd, and shorter than prompt + generation

struct TinyModel {
  std::unique_ptr<CpuDevice> device;
  std::unique_ptr<Trainer> trainer;
};

TinyModel LoadLlamaTiny(int rows = 1) {
  TinyModel m;
  const std::string dir = "tests/golden/llama_tiny";
  absl::StatusOr<ModelConfig> config = LoadModelConfig(dir + "/config.json");
  EXPECT_TRUE(config.ok()) << config.status();
  DeviceOptions d;
  d.arena_bytes = 64 << 20;
  d.pinned_budget_bytes = 256 << 20;
  absl::StatusOr<std::unique_ptr<CpuDevice>> device = CpuDevice::Create(d);
  EXPECT_TRUE(device.ok()) << device.status();
  m.device = std::move(*device);
  TrainerOptions o;
  o.micro_batch_size = rows;
  o.seq_len = kContext;
  o.collect_timeline = false;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(*m.device, *config, o);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  m.trainer = std::move(*trainer);
  absl::Status loaded = m.trainer->LoadHfWeights(dir);
  EXPECT_TRUE(loaded.ok()) << loaded;
  return m;
}

const std::vector<int32_t> kPrompt = {3, 17, 42, 5, 88};

TEST(SamplerTest, GreedyMatchesArgmaxOfTrainerLogits) {
  TinyModel m = LoadLlamaTiny();
  ASSERT_NE(m.trainer, nullptr);
  const int vocab = static_cast<int>(m.trainer->config().vocab_size);
  SamplingOptions greedy;
  greedy.max_new_tokens = 11;  // 5 + 11 > 13: the window slides
  Sampler sampler(*m.trainer, kContext);
  absl::StatusOr<std::vector<int32_t>> got = sampler.Generate(kPrompt, greedy);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 11u);

  // The reference pads with a different id than the sampler (the pad comes
  // after the last real token, so causal attention must ignore it).
  std::vector<int32_t> sequence = kPrompt;
  std::vector<int32_t> expected;
  for (int n = 0; n < 11; ++n) {
    const size_t used = std::min<size_t>(sequence.size(), kContext);
    std::vector<int32_t> window(kContext, 61);
    std::copy(sequence.end() - static_cast<int64_t>(used), sequence.end(), window.begin());
    absl::StatusOr<std::vector<float>> logits = m.trainer->Logits(window.data());
    ASSERT_TRUE(logits.ok()) << logits.status();
    ASSERT_EQ(logits->size(), static_cast<size_t>(kContext * vocab));
    const float* row = logits->data() + (used - 1) * vocab;
    int32_t best = 0;
    for (int v = 1; v < vocab; ++v) {
      if (row[v] > row[best]) best = v;
    }
    expected.push_back(best);
    sequence.push_back(best);
  }
  EXPECT_EQ(*got, expected);
}

TEST(SamplerTest, TopPNearZeroIsGreedyAndSeedsAreDeterministic) {
  TinyModel m = LoadLlamaTiny();
  ASSERT_NE(m.trainer, nullptr);
  Sampler sampler(*m.trainer, kContext);
  SamplingOptions greedy;
  greedy.max_new_tokens = 9;
  absl::StatusOr<std::vector<int32_t>> argmax = sampler.Generate(kPrompt, greedy);
  ASSERT_TRUE(argmax.ok()) << argmax.status();

  SamplingOptions narrow = greedy;
  narrow.temperature = 0.9;
  narrow.top_p = 1e-9;
  narrow.seed = 77;
  EXPECT_EQ(*sampler.Generate(kPrompt, narrow), *argmax);

  SamplingOptions hot = greedy;
  hot.max_new_tokens = 17;
  hot.temperature = 1.7;
  hot.top_p = 0.97;
  hot.seed = 5;
  absl::StatusOr<std::vector<int32_t>> first = sampler.Generate(kPrompt, hot);
  absl::StatusOr<std::vector<int32_t>> again = sampler.Generate(kPrompt, hot);
  ASSERT_TRUE(first.ok() && again.ok());
  EXPECT_EQ(*first, *again);
  hot.seed = 6;
  EXPECT_NE(*sampler.Generate(kPrompt, hot), *first);
}

TEST(SamplerTest, StopsAtTheStopTokenAndRefusesBadInput) {
  TinyModel m = LoadLlamaTiny();
  ASSERT_NE(m.trainer, nullptr);
  Sampler sampler(*m.trainer, kContext);
  SamplingOptions greedy;
  greedy.max_new_tokens = 9;
  absl::StatusOr<std::vector<int32_t>> full = sampler.Generate(kPrompt, greedy);
  ASSERT_TRUE(full.ok());
  SamplingOptions stopping = greedy;
  stopping.stop_token = (*full)[2];
  absl::StatusOr<std::vector<int32_t>> stopped = sampler.Generate(kPrompt, stopping);
  ASSERT_TRUE(stopped.ok());
  const auto first_stop = std::find(full->begin(), full->end(), (*full)[2]);
  EXPECT_EQ(*stopped, std::vector<int32_t>(full->begin(), first_stop + 1));
  // Any of several stop tokens (a chat template's end-of-turn and eos): the first one emitted.
  SamplingOptions any_stop = greedy;
  any_stop.stop_tokens = {(*full)[4], (*full)[3]};
  absl::StatusOr<std::vector<int32_t>> any_stopped = sampler.Generate(kPrompt, any_stop);
  ASSERT_TRUE(any_stopped.ok());
  const auto first_any = std::find_if(full->begin(), full->end(), [&](int32_t t) {
    return t == (*full)[3] || t == (*full)[4];
  });
  EXPECT_EQ(*any_stopped, std::vector<int32_t>(full->begin(), first_any + 1));

  SamplingOptions limited = greedy;
  limited.vocab_limit = 7;
  limited.temperature = 1.5;
  absl::StatusOr<std::vector<int32_t>> small = sampler.Generate(kPrompt, limited);
  ASSERT_TRUE(small.ok());
  for (int32_t t : *small) EXPECT_LT(t, 7);

  EXPECT_EQ(sampler.Generate({}, greedy).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> outside = {96};
  EXPECT_EQ(sampler.Generate(outside, greedy).status().code(), absl::StatusCode::kInvalidArgument);
  Sampler wrong_window(*m.trainer, kContext + 2);
  EXPECT_EQ(wrong_window.Generate(kPrompt, greedy).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// Three rows, four prompts (a second group with two spare rows), one longer than the window:
// each reply equals the prompt's reply alone in the first row, computed here by argmax over
// Trainer::Logits; a stop token ends only the replies that emit it (at its first), the others
// run to the length limit.
TEST(SamplerTest, GreedyRepliesPerRowEqualEachPromptAlone) {
  constexpr int kRows = 3;
  TinyModel m = LoadLlamaTiny(kRows);
  ASSERT_NE(m.trainer, nullptr);
  const int vocab = static_cast<int>(m.trainer->config().vocab_size);
  const std::vector<std::vector<int32_t>> prompts = {
      kPrompt, {7}, {90, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {33, 44}};
  constexpr int kTokens = 6;
  std::vector<std::vector<int32_t>> alone;
  for (const std::vector<int32_t>& prompt : prompts) {
    std::vector<int32_t> sequence = prompt;
    std::vector<int32_t> reply;
    for (int n = 0; n < kTokens; ++n) {
      const size_t used = std::min<size_t>(sequence.size(), kContext);
      std::vector<int32_t> window(static_cast<size_t>(kRows * kContext), 61);
      std::copy(sequence.end() - static_cast<int64_t>(used), sequence.end(), window.begin());
      absl::StatusOr<std::vector<float>> logits = m.trainer->Logits(window.data());
      ASSERT_TRUE(logits.ok()) << logits.status();
      const float* row = logits->data() + (used - 1) * vocab;
      const int32_t best = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
      reply.push_back(best);
      sequence.push_back(best);
    }
    alone.push_back(reply);
  }
  Sampler sampler(*m.trainer, kContext, kRows);
  SamplingOptions greedy;
  greedy.max_new_tokens = kTokens;
  greedy.temperature = 1.0;  // ignored: always argmax
  absl::StatusOr<std::vector<GreedyReply>> got = sampler.GenerateGreedy(prompts, greedy);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ((*got)[i].ids, alone[i]) << "prompt " << i;
    EXPECT_FALSE((*got)[i].stopped) << "prompt " << i;
  }

  SamplingOptions stopping = greedy;
  stopping.stop_tokens = {alone[0][2]};
  absl::StatusOr<std::vector<GreedyReply>> stopped = sampler.GenerateGreedy(prompts, stopping);
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto stop = std::find(alone[i].begin(), alone[i].end(), alone[0][2]);
    const bool has_stop = stop != alone[i].end();
    EXPECT_EQ((*stopped)[i].ids,
              std::vector<int32_t>(alone[i].begin(), has_stop ? stop + 1 : alone[i].end()))
        << "prompt " << i;
    EXPECT_EQ((*stopped)[i].stopped, has_stop) << "prompt " << i;
  }
  EXPECT_TRUE((*stopped)[0].stopped);

  EXPECT_EQ(sampler.GenerateGreedy({kPrompt, {}}, greedy).status().code(),
            absl::StatusCode::kInvalidArgument);
  Sampler wrong_rows(*m.trainer, kContext, kRows + 1);
  EXPECT_EQ(wrong_rows.GenerateGreedy(prompts, greedy).status().code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<std::vector<GreedyReply>> none = sampler.GenerateGreedy({}, greedy);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

// The interruption is polled once per forward (not per prompt): asked to stop at its k-th poll,
// a generation has run exactly k - 1 forwards and ends CANCELLED, in the middle of a reply.
TEST(SamplerTest, InterruptedGenerationEndsBeforeItsNextForward) {
  constexpr int kRows = 2;
  TinyModel m = LoadLlamaTiny(kRows);
  ASSERT_NE(m.trainer, nullptr);
  Sampler sampler(*m.trainer, kContext, kRows);
  SamplingOptions greedy;
  greedy.max_new_tokens = 8;  // 3 prompts in 2 groups: up to 16 forwards
  int polls = 0;
  greedy.interrupted = [&polls] { return ++polls == 3; };
  absl::StatusOr<std::vector<GreedyReply>> got =
      sampler.GenerateGreedy({kPrompt, {7}, {33, 44}}, greedy);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kCancelled) << got.status();
  EXPECT_EQ(polls, 3);

  // Generate (one prompt) polls the same way.
  polls = 0;
  greedy.interrupted = [&polls] { return ++polls == 5; };
  EXPECT_EQ(sampler.Generate(kPrompt, greedy).status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(polls, 5);

  // Never asked to stop: the whole replies, each poll answered once per forward.
  polls = 0;
  greedy.interrupted = [&polls] { return ++polls == 0; };
  absl::StatusOr<std::vector<GreedyReply>> whole =
      sampler.GenerateGreedy({kPrompt, {7}, {33, 44}}, greedy);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(polls, 16);
}

TEST(ChooseTokenTest, GreedyTiesAndNucleus) {
  std::mt19937_64 rng(3);
  const std::vector<float> tied = {0.5f, 2.0f, -1.0f, 2.0f, 0.25f};
  EXPECT_EQ(ChooseToken(tied, 0.0, 1.0, rng), 1);
  EXPECT_EQ(ChooseToken(tied, 1.0, 1e-12, rng), 1);

  // Probabilities 0.5, 0.3, 0.15, 0.05 (permuted): top_p 0.7 keeps ids 2 and 0.
  const std::vector<float> logits = {std::log(0.3f), std::log(0.05f), std::log(0.5f),
                                     std::log(0.15f)};
  std::set<int32_t> seen;
  int count_of_2 = 0;
  for (int i = 0; i < 3001; ++i) {
    const int32_t t = ChooseToken(logits, 1.0, 0.7, rng);
    seen.insert(t);
    count_of_2 += t == 2;
  }
  EXPECT_EQ(seen, (std::set<int32_t>{0, 2}));
  // Renormalized over the nucleus: P(2) = 0.5 / 0.8 = 0.625.
  EXPECT_NEAR(count_of_2 / 3001.0, 0.625, 0.04);
  std::set<int32_t> all;
  for (int i = 0; i < 3001; ++i) all.insert(ChooseToken(logits, 1.0, 1.0, rng));
  EXPECT_EQ(all.size(), 4u);
}

}  // namespace
}  // namespace megatrain::engine
