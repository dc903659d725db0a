// Deterministic windowing and shuffling of a token stream.
#include "engine/data/token_windows.h"

#include <algorithm>
#include <random>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/fatal.h"

namespace megatrain::engine {

absl::StatusOr<TokenWindows> TokenWindows::Create(std::vector<int32_t> tokens, int seq_len,
                                                  double validation_fraction, uint64_t seed) {
  return Create(std::make_shared<VectorTokens>(std::move(tokens)), seq_len, validation_fraction,
                seed);
}

absl::StatusOr<TokenWindows> TokenWindows::Create(std::shared_ptr<const TokenSource> tokens,
                                                  int seq_len, double validation_fraction,
                                                  uint64_t seed) {
  if (seq_len <= 0) return absl::InvalidArgumentError(absl::StrCat("seq_len=", seq_len));
  if (!(validation_fraction >= 0.0 && validation_fraction <= 0.5)) {
    return absl::InvalidArgumentError(
        absl::StrCat("validation_fraction=", validation_fraction, " must be in [0, 0.5]"));
  }
  TokenWindows w;
  w.tokens_ = std::move(tokens);
  w.seq_len_ = seq_len;
  w.seed_ = seed;
  const size_t split =
      static_cast<size_t>(static_cast<double>(w.tokens_->size()) * (1.0 - validation_fraction));
  const size_t span = static_cast<size_t>(seq_len) + 1;
  for (size_t s = 0; s + span <= split; s += seq_len) w.train_starts_.push_back(s);
  for (size_t s = split; s + span <= w.tokens_->size(); s += seq_len) {
    w.validation_starts_.push_back(s);
  }
  if (w.train_starts_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "only ", w.tokens_->size(), " tokens: no training window of seq_len=", seq_len));
  }
  if (validation_fraction > 0 && w.validation_starts_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("validation_fraction=", validation_fraction,
                                                   " leaves no whole window of seq_len=", seq_len));
  }
  return w;
}

void TokenWindows::Reshuffle(uint64_t epoch) {
  if (epoch == shuffled_epoch_) return;
  order_.assign(train_starts_.begin(), train_starts_.end());
  // std::mt19937_64 is specified exactly by the standard; the shuffle is our
  // own Fisher-Yates so the order does not depend on the library version.
  std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ull + epoch);
  for (size_t i = order_.size(); i > 1; --i) {
    const size_t j = rng() % i;
    std::swap(order_[i - 1], order_[j]);
  }
  shuffled_epoch_ = epoch;
}

void TokenWindows::Fill(size_t start, int row, WindowBatch* out) const {
  for (int t = 0; t < seq_len_; ++t) {
    out->inputs[static_cast<size_t>(row) * seq_len_ + t] = tokens_->at(start + t);
    out->targets[static_cast<size_t>(row) * seq_len_ + t] = tokens_->at(start + t + 1);
  }
}

WindowBatch TokenWindows::NextTrainBatch(int batch) {
  WindowBatch out{batch, seq_len_, std::vector<int32_t>(static_cast<size_t>(batch) * seq_len_),
                  std::vector<int32_t>(static_cast<size_t>(batch) * seq_len_)};
  for (int b = 0; b < batch; ++b) {
    const uint64_t epoch = cursor_ / train_starts_.size();
    Reshuffle(epoch);
    Fill(order_[cursor_ % train_starts_.size()], b, &out);
    ++cursor_;
  }
  return out;
}

WindowBatch TokenWindows::ValidationBatch(int first, int batch) const {
  if (validation_starts_.empty()) {
    internal::DieBecause("TokenWindows::ValidationBatch without validation windows");
  }
  WindowBatch out{batch, seq_len_, std::vector<int32_t>(static_cast<size_t>(batch) * seq_len_),
                  std::vector<int32_t>(static_cast<size_t>(batch) * seq_len_)};
  for (int b = 0; b < batch; ++b) {
    Fill(validation_starts_[(static_cast<size_t>(first) + b) % validation_starts_.size()], b, &out);
  }
  return out;
}

void TokenWindows::set_cursor(uint64_t cursor) { cursor_ = cursor; }

}  // namespace megatrain::engine
