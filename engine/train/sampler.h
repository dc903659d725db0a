// Text generation from a trainer's current weights: greedy or temperature +
// top-p (nucleus) sampling from a seeded generator, re-running the whole
// context window for every token (simple and O(n^2); fine for demos), and greedy
// replies to several prompts at once, one per row of the trainer's micro-batch
// (a fine-tuning job's eval prompts, between its steps).
#pragma once

#include <cstdint>
#include <functional>
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
  // Polled before every forward, i.e. between generated tokens: true ends the generation with
  // CANCELLED, so a long reply (a fine-tuning job's eval round: up to 8 prompts x 512 tokens)
  // never delays a job's cancel or pause by more than one forward. Null: never asked.
  std::function<bool()> interrupted;
};

// The next token from one row of logits. Greedy: the largest logit (lowest
// id on ties). Otherwise softmax(logits / temperature) in double, the most
// likely tokens (by probability, then id) whose mass first reaches top_p
// (at least one), and one draw of `rng` over them.
int32_t ChooseToken(absl::Span<const float> logits, double temperature, double top_p,
                    std::mt19937_64& rng);

// One greedy reply: the generated ids (the stop token included when it ended one).
struct GreedyReply {
  std::vector<int32_t> ids;
  bool stopped = false;  // ended at a stop token, not at max_new_tokens
};

class Sampler {
 public:
  // `trainer` must have been created with micro_batch_size = `rows` and
  // seq_len = `context` (checked at each forward).
  Sampler(Trainer& trainer, int context, int rows = 1)
      : trainer_(trainer), context_(context), rows_(rows) {}

  // The generated tokens (without the prompt), in the micro-batch's first row.
  // Each step runs the last `context` tokens, padded after the end (causal
  // attention makes the pad invisible), and chooses from the logits of the
  // last real position.
  absl::StatusOr<std::vector<int32_t>> Generate(absl::Span<const int32_t> prompt,
                                                const SamplingOptions& options);

  // Greedy replies (argmax, whatever options.temperature says) to every prompt,
  // as Generate would give each, `rows` prompts per forward: a group runs until
  // each of its replies has met a stop token (stop_token, stop_tokens) or
  // max_new_tokens. Reads the weights only: the trainer's steps are unchanged.
  absl::StatusOr<std::vector<GreedyReply>> GenerateGreedy(
      const std::vector<std::vector<int32_t>>& prompts, const SamplingOptions& options);

 private:
  // Checks the shape and `prompt`'s ids (`which` names it in errors).
  absl::Status CheckPrompt(absl::Span<const int32_t> prompt, const std::string& which) const;
  // One forward of a micro-batch whose row r holds the last `context` tokens of
  // *sequences[r], padded after the end (rows without a sequence are all pad).
  // Returns the logits; (*last)[r] is where sequence r's last position's row starts.
  absl::StatusOr<std::vector<float>> Forward(
      const std::vector<const std::vector<int32_t>*>& sequences, std::vector<size_t>* last);

  Trainer& trainer_;
  int context_;
  int rows_;
};

// Whether `token` ends a reply under `options` (stop_token or one of stop_tokens).
bool IsStopToken(const SamplingOptions& options, int32_t token);

}  // namespace megatrain::engine
