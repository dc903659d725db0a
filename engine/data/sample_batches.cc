// Packing SFT samples into rows with masks, positions and segments (see sample_batches.h).
#include "engine/data/sample_batches.h"

#include <algorithm>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"

namespace megatrain::engine {

absl::StatusOr<OverlongPolicy> ParseOverlongPolicy(std::string_view name) {
  if (name == "truncate") return OverlongPolicy::kTruncate;
  if (name == "refuse") return OverlongPolicy::kRefuse;
  return absl::InvalidArgumentError(
      absl::StrCat("overlong=\"", std::string(name), "\" is not truncate or refuse"));
}

absl::StatusOr<SampleBatches> SampleBatches::Create(std::shared_ptr<const SampleSource> samples,
                                                    const SampleBatchOptions& options) {
  if (options.seq_len <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("seq_len=", options.seq_len));
  }
  if (!(options.validation_fraction >= 0.0 && options.validation_fraction <= 0.5)) {
    return absl::InvalidArgumentError(
        absl::StrCat("validation_fraction=", options.validation_fraction, " must be in [0, 0.5]"));
  }
  SampleBatches b;
  b.source_ = std::move(samples);
  b.options_ = options;
  const size_t n = b.source_->samples();
  const size_t window = static_cast<size_t>(options.seq_len) + 1;
  const size_t split =
      static_cast<size_t>(static_cast<double>(n) * (1.0 - options.validation_fraction));
  std::vector<size_t> validation;
  for (size_t i = 0; i < n; ++i) {
    const size_t length = b.source_->SampleLength(i);
    if (length < 2) {
      ++b.dropped_;
      continue;
    }
    if (length > window) {
      if (options.overlong == OverlongPolicy::kRefuse) {
        return absl::InvalidArgumentError(
            absl::StrCat("sample ", i, " has ", length, " tokens, more than seq_len + 1 = ", window,
                         " (overlong=refuse; overlong=truncate keeps its first ", window, ")"));
      }
      ++b.truncated_;
      // What stays of it may hold no counted target (a long prompt before a short reply): such
      // a sample trains nothing, and the run says how many there are.
      if (!options.train_on_prompt) {
        Sample kept;
        if (absl::Status s = b.source_->ReadSample(i, window, &kept); !s.ok()) return s;
        if (std::none_of(kept.mask.begin() + 1, kept.mask.end(), [](uint8_t m) { return m != 0; })) {
          ++b.truncated_without_targets_;
        }
      }
    }
    (i < split ? b.train_samples_ : validation).push_back(i);
  }
  if (b.train_samples_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        n, " samples (", b.dropped_, " dropped with fewer than 2 tokens): no training sample"));
  }
  if (options.validation_fraction > 0 && validation.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("validation_fraction=", options.validation_fraction,
                     " leaves no validation sample of ", n));
  }
  b.validation_samples_ = validation.size();
  // Validation rows: the same packing over the held-out samples in file order, planned once.
  size_t used = 0;
  for (size_t s : validation) {
    const size_t length = b.UsedLength(s);
    if (b.validation_rows_.empty() || !options.pack || used + length > window) {
      b.validation_rows_.emplace_back();
      used = 0;
    }
    b.validation_rows_.back().push_back(s);
    used += length;
  }
  return b;
}

size_t SampleBatches::UsedLength(size_t sample) const {
  return std::min(source_->SampleLength(sample), static_cast<size_t>(options_.seq_len) + 1);
}

void SampleBatches::Reshuffle(uint64_t epoch) {
  if (epoch == shuffled_epoch_) return;
  order_ = train_samples_;
  // The same generator and Fisher-Yates as TokenWindows: exactly specified, library-independent.
  std::mt19937_64 rng(options_.seed * 0x9E3779B97F4A7C15ull + epoch);
  for (size_t i = order_.size(); i > 1; --i) {
    const size_t j = rng() % i;
    std::swap(order_[i - 1], order_[j]);
  }
  shuffled_epoch_ = epoch;
}

size_t SampleBatches::TrainSampleAt(uint64_t cursor) {
  Reshuffle(cursor / train_samples_.size());
  return order_[cursor % train_samples_.size()];
}

absl::Status SampleBatches::FillRow(const std::vector<size_t>& samples, int row,
                                    WindowBatch* out) const {
  const size_t seq = static_cast<size_t>(options_.seq_len);
  const size_t at = static_cast<size_t>(row) * seq;
  int32_t* inputs = out->inputs.data() + at;
  int32_t* targets = out->targets.data() + at;
  int32_t* positions = out->positions.data() + at;
  int32_t* segments = out->segments.data() + at;
  size_t slot = 0;  // next free slot of the row's seq + 1
  int32_t segment = 0;
  Sample sample;
  for (size_t index : samples) {
    const size_t length = UsedLength(index);
    if (absl::Status s = source_->ReadSample(index, length, &sample); !s.ok()) return s;
    for (size_t i = 0; i < length; ++i, ++slot) {
      if (slot >= seq) break;  // the window's last slot is only ever a target
      inputs[slot] = sample.tokens[i];
      const bool counts = i + 1 < length && (options_.train_on_prompt || sample.mask[i + 1] != 0);
      targets[slot] = counts ? sample.tokens[i + 1] : -1;
      positions[slot] = static_cast<int32_t>(i);
      segments[slot] = segment;
    }
    ++segment;
  }
  // Padding: its own segment, positions from 0, nothing counted.
  for (size_t p = 0; slot < seq; ++slot, ++p) {
    inputs[slot] = 0;
    targets[slot] = -1;
    positions[slot] = static_cast<int32_t>(p);
    segments[slot] = segment;
  }
  return absl::OkStatus();
}

namespace {

WindowBatch EmptyRows(int batch, int seq_len) {
  const size_t n = static_cast<size_t>(batch) * static_cast<size_t>(seq_len);
  WindowBatch out{batch,
                  seq_len,
                  std::vector<int32_t>(n),
                  std::vector<int32_t>(n),
                  std::vector<int32_t>(n),
                  std::vector<int32_t>(n)};
  return out;
}

}  // namespace

absl::StatusOr<WindowBatch> SampleBatches::NextTrainBatch(int batch) {
  WindowBatch out = EmptyRows(batch, options_.seq_len);
  const size_t window = static_cast<size_t>(options_.seq_len) + 1;
  uint64_t cursor = cursor_;
  std::vector<size_t> row_samples;
  for (int row = 0; row < batch; ++row) {
    row_samples.clear();
    size_t used = 0;
    // Every used length fits a window, so each row takes at least one sample.
    while (true) {
      const size_t sample = TrainSampleAt(cursor);
      const size_t length = UsedLength(sample);
      if (!row_samples.empty() && (!options_.pack || used + length > window)) break;
      row_samples.push_back(sample);
      used += length;
      ++cursor;
    }
    if (absl::Status s = FillRow(row_samples, row, &out); !s.ok()) return s;
  }
  cursor_ = cursor;
  return out;
}

absl::StatusOr<WindowBatch> SampleBatches::ValidationBatch(int first, int batch) const {
  if (validation_rows_.empty()) {
    return absl::FailedPreconditionError("SampleBatches::ValidationBatch without validation rows");
  }
  WindowBatch out = EmptyRows(batch, options_.seq_len);
  for (int row = 0; row < batch; ++row) {
    const size_t r =
        (static_cast<size_t>(first) + static_cast<size_t>(row)) % validation_rows_.size();
    if (absl::Status s = FillRow(validation_rows_[r], row, &out); !s.ok()) return s;
  }
  return out;
}

}  // namespace megatrain::engine
