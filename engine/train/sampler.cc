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

// CANCELLED when options.interrupted asks to stop before generated token `n`.
absl::Status CheckInterrupted(const SamplingOptions& options, int n) {
  if (options.interrupted && options.interrupted()) {
    return absl::CancelledError(absl::StrCat("generation interrupted before token ", n + 1));
  }
  return absl::OkStatus();
}

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

bool IsStopToken(const SamplingOptions& options, int32_t token) {
  if (options.stop_token.has_value() && token == *options.stop_token) return true;
  return std::find(options.stop_tokens.begin(), options.stop_tokens.end(), token) !=
         options.stop_tokens.end();
}

absl::Status Sampler::CheckPrompt(absl::Span<const int32_t> prompt,
                                  const std::string& which) const {
  if (context_ < 1 || rows_ < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("context=", context_, " and rows=", rows_, " must be >= 1"));
  }
  if (prompt.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(which, " is empty: give at least one token"));
  }
  const int64_t vocab = trainer_.config().vocab_size;
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(which, " token ", i, " is id ", prompt[i],
                                                     ", outside vocab_size=", vocab));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> Sampler::Forward(
    const std::vector<const std::vector<int32_t>*>& sequences, std::vector<size_t>* last) {
  const size_t context = static_cast<size_t>(context_);
  const size_t vocab = static_cast<size_t>(trainer_.config().vocab_size);
  std::vector<int32_t> window(context * static_cast<size_t>(rows_), 0);
  last->clear();
  for (size_t r = 0; r < sequences.size(); ++r) {
    const std::vector<int32_t>& sequence = *sequences[r];
    const size_t used = std::min(sequence.size(), context);
    std::copy(sequence.end() - static_cast<int64_t>(used), sequence.end(),
              window.begin() + static_cast<int64_t>(r * context));
    last->push_back((r * context + used - 1) * vocab);
  }
  absl::StatusOr<std::vector<float>> logits = trainer_.Logits(window.data());
  if (!logits.ok()) return logits.status();
  if (logits->size() != window.size() * vocab) {
    return absl::FailedPreconditionError(
        absl::StrCat("the trainer returned ", logits->size(), " logits for ", rows_,
                     " rows of ", context_, " tokens: it needs micro_batch_size=", rows_,
                     " and seq_len=", context_));
  }
  return logits;
}

absl::StatusOr<std::vector<int32_t>> Sampler::Generate(absl::Span<const int32_t> prompt,
                                                       const SamplingOptions& options) {
  if (absl::Status s = CheckPrompt(prompt, "prompt"); !s.ok()) return s;
  const int64_t vocab = trainer_.config().vocab_size;
  const int64_t choosable = options.vocab_limit > 0 ? std::min(options.vocab_limit, vocab) : vocab;
  std::mt19937_64 rng(options.seed);
  std::vector<int32_t> sequence(prompt.begin(), prompt.end());
  std::vector<int32_t> generated;
  std::vector<size_t> last;
  for (int n = 0; n < options.max_new_tokens; ++n) {
    if (absl::Status s = CheckInterrupted(options, n); !s.ok()) return s;
    absl::StatusOr<std::vector<float>> logits = Forward({&sequence}, &last);
    if (!logits.ok()) return logits.status();
    const absl::Span<const float> row =
        absl::MakeConstSpan(*logits).subspan(last[0], static_cast<size_t>(choosable));
    const int32_t next = ChooseToken(row, options.temperature, options.top_p, rng);
    sequence.push_back(next);
    generated.push_back(next);
    if (IsStopToken(options, next)) break;
  }
  return generated;
}

absl::StatusOr<std::vector<GreedyReply>> Sampler::GenerateGreedy(
    const std::vector<std::vector<int32_t>>& prompts, const SamplingOptions& options) {
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (absl::Status s = CheckPrompt(prompts[i], absl::StrCat("prompt ", i)); !s.ok()) return s;
  }
  const int64_t vocab = trainer_.config().vocab_size;
  const size_t choosable = static_cast<size_t>(
      options.vocab_limit > 0 ? std::min(options.vocab_limit, vocab) : vocab);
  std::mt19937_64 unused_rng(options.seed);  // greedy never draws
  std::vector<GreedyReply> replies(prompts.size());
  std::vector<size_t> last;
  for (size_t first = 0; first < prompts.size(); first += static_cast<size_t>(rows_)) {
    const size_t count = std::min(prompts.size() - first, static_cast<size_t>(rows_));
    std::vector<std::vector<int32_t>> sequences(prompts.begin() + static_cast<int64_t>(first),
                                                prompts.begin() +
                                                    static_cast<int64_t>(first + count));
    std::vector<const std::vector<int32_t>*> rows;
    for (const std::vector<int32_t>& s : sequences) rows.push_back(&s);
    for (int n = 0; n < options.max_new_tokens; ++n) {
      bool open = false;
      for (size_t r = 0; r < count; ++r) open = open || !replies[first + r].stopped;
      if (!open) break;
      if (absl::Status s = CheckInterrupted(options, n); !s.ok()) return s;
      absl::StatusOr<std::vector<float>> logits = Forward(rows, &last);
      if (!logits.ok()) return logits.status();
      for (size_t r = 0; r < count; ++r) {
        GreedyReply& reply = replies[first + r];
        if (reply.stopped) continue;  // its row still runs; its logits are not read
        const int32_t next = ChooseToken(
            absl::MakeConstSpan(*logits).subspan(last[r], choosable), 0, 1, unused_rng);
        sequences[r].push_back(next);
        reply.ids.push_back(next);
        reply.stopped = IsStopToken(options, next);
      }
    }
  }
  return replies;
}

}  // namespace megatrain::engine
