// Greedy and top-p sampling over Trainer::Logits (see sampler.h).
#include "engine/train/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace megatrain::engine {
namespace {

// A uniform double in [0, 1) from 53 random bits; std::uniform_real_distribution
// is implementation-defined, which would make samples depend on the library.
double UniformUnit(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

}  // namespace

int32_t ChooseToken(absl::Span<const float> logits, double temperature, double top_p,
                    std::mt19937_64& rng) {
  const int32_t argmax =
      static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  if (temperature <= 0) return argmax;
  const double max_logit = logits[argmax];
  std::vector<double> probs(logits.size());
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    probs[i] = std::exp((static_cast<double>(logits[i]) - max_logit) / temperature);
    total += probs[i];
  }
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return probs[a] != probs[b] ? probs[a] > probs[b] : a < b;
  });
  size_t kept = 0;
  double kept_mass = 0;
  while (kept < order.size() && (kept == 0 || kept_mass < top_p * total)) {
    kept_mass += probs[order[kept]];
    ++kept;
  }
  double target = UniformUnit(rng) * kept_mass;
  for (size_t i = 0; i + 1 < kept; ++i) {
    target -= probs[order[i]];
    if (target < 0) return order[i];
  }
  return order[kept - 1];
}

absl::StatusOr<std::vector<int32_t>> Sampler::Generate(absl::Span<const int32_t> prompt,
                                                       const SamplingOptions& options) {
  if (context_ < 1) {
    return absl::InvalidArgumentError(absl::StrCat("context=", context_, " must be >= 1"));
  }
  if (prompt.empty()) {
    return absl::InvalidArgumentError("prompt is empty: give at least one token");
  }
  const int64_t vocab = trainer_.config().vocab_size;
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt token ", i, " is id ", prompt[i], ", outside vocab_size=", vocab));
    }
  }
  const int64_t choosable = options.vocab_limit > 0 ? std::min(options.vocab_limit, vocab) : vocab;
  std::mt19937_64 rng(options.seed);
  std::vector<int32_t> sequence(prompt.begin(), prompt.end());
  std::vector<int32_t> generated;
  std::vector<int32_t> window(static_cast<size_t>(context_));
  for (int n = 0; n < options.max_new_tokens; ++n) {
    const size_t used = std::min(sequence.size(), window.size());
    std::fill(window.begin(), window.end(), 0);
    std::copy(sequence.end() - static_cast<int64_t>(used), sequence.end(), window.begin());
    absl::StatusOr<std::vector<float>> logits = trainer_.Logits(window.data());
    if (!logits.ok()) return logits.status();
    if (logits->size() != window.size() * static_cast<size_t>(vocab)) {
      return absl::FailedPreconditionError(
          absl::StrCat("the trainer returned ", logits->size(), " logits for a window of ",
                       context_, " tokens: it needs micro_batch_size=1 and seq_len=", context_));
    }
    const absl::Span<const float> row =
        absl::MakeConstSpan(*logits).subspan((used - 1) * static_cast<size_t>(vocab), choosable);
    const int32_t next = ChooseToken(row, options.temperature, options.top_p, rng);
    sequence.push_back(next);
    generated.push_back(next);
    if (options.stop_token.has_value() && next == *options.stop_token) break;
    if (std::find(options.stop_tokens.begin(), options.stop_tokens.end(), next) !=
        options.stop_tokens.end()) {
      break;
    }
  }
  return generated;
}

}  // namespace megatrain::engine
