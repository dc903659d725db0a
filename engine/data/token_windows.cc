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

absl::Status TokenWindows::Fill(size_t start, int row, WindowBatch* out) const {
  // One read of the window's seq_len + 1 tokens: inputs are the first seq_len, targets the last.
  std::vector<int32_t> window(static_cast<size_t>(seq_len_) + 1);
  if (absl::Status s = tokens_->Read(start, window.size(), window.data()); !s.ok()) return s;
  const auto at = static_cast<std::ptrdiff_t>(row) * seq_len_;
  std::copy(window.begin(), window.end() - 1, out->inputs.begin() + at);
  std::copy(window.begin() + 1, window.end(), out->targets.begin() + at);
  return absl::OkStatus();
}

absl::StatusOr<WindowBatch> TokenWindows::NextTrainBatch(int batch) {
  WindowBatch out;  // plain windows: no positions or segments (one sample per row)
  out.batch = batch;
  out.seq_len = seq_len_;
  out.inputs.resize(static_cast<size_t>(batch) * seq_len_);
  out.targets.resize(static_cast<size_t>(batch) * seq_len_);
  uint64_t cursor = cursor_;
  for (int b = 0; b < batch; ++b) {
    const uint64_t epoch = cursor / train_starts_.size();
    Reshuffle(epoch);
    if (absl::Status s = Fill(order_[cursor % train_starts_.size()], b, &out); !s.ok()) return s;
    ++cursor;
  }
  cursor_ = cursor;
  return out;
}

absl::StatusOr<WindowBatch> TokenWindows::ValidationBatch(int first, int batch) const {
  if (validation_starts_.empty()) {
    internal::DieBecause("TokenWindows::ValidationBatch without validation windows");
  }
  WindowBatch out;  // plain windows: no positions or segments (one sample per row)
  out.batch = batch;
  out.seq_len = seq_len_;
  out.inputs.resize(static_cast<size_t>(batch) * seq_len_);
  out.targets.resize(static_cast<size_t>(batch) * seq_len_);
  for (int b = 0; b < batch; ++b) {
    if (absl::Status s = Fill(
            validation_starts_[(static_cast<size_t>(first) + b) % validation_starts_.size()], b, &out);
        !s.ok()) {
      return s;
    }
  }
  return out;
}

void TokenWindows::set_cursor(uint64_t cursor) { cursor_ = cursor; }

}  // namespace megatrain::engine
