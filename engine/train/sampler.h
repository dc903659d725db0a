// Text generation from a trainer's current weights: greedy or temperature +
// top-p (nucleus) sampling from a seeded generator, re-running the whole
// context window for every token (simple and O(n^2); fine for demos).
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/train/trainer.h"

namespace megatrain::engine {

struct SamplingOptions {
  int max_new_tokens = 64;
  double temperature = 0;             // <= 0: greedy (argmax)
  double top_p = 1.0;                 // nucleus mass; tiny values keep only the most likely token
  uint64_t seed = 1;                  // same seed, weights and prompt -> same tokens
  std::optional<int32_t> stop_token;  // generation ends after emitting it
  // Also end after emitting any of these (a chat template's end-of-turn and eos tokens).
  std::vector<int32_t> stop_tokens;
  // Only ids below this are chosen (a tokenizer smaller than the model's
  // vocabulary); 0 = every id.
  int64_t vocab_limit = 0;
};

// The next token from one row of logits. Greedy: the largest logit (lowest
// id on ties). Otherwise softmax(logits / temperature) in double, the most
// likely tokens (by probability, then id) whose mass first reaches top_p
// (at least one), and one draw of `rng` over them.
int32_t ChooseToken(absl::Span<const float> logits, double temperature, double top_p,
                    std::mt19937_64& rng);

class Sampler {
 public:
  // `trainer` must have been created with micro_batch_size 1 and seq_len =
  // `context` (checked at the first Generate).
  Sampler(Trainer& trainer, int context) : trainer_(trainer), context_(context) {}

  // The generated tokens (without the prompt). Each step runs the last
  // `context` tokens, padded after the end (causal attention makes the pad
  // invisible), and chooses from the logits of the last real position.
  absl::StatusOr<std::vector<int32_t>> Generate(absl::Span<const int32_t> prompt,
                                                const SamplingOptions& options);

 private:
  Trainer& trainer_;
  int context_;
};

}  // namespace megatrain::engine
