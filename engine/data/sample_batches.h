// Micro-batches of SFT samples (sample_set_file.h): a train/validation split by sample, a
// deterministic per-epoch shuffle by seed with a cursor a checkpoint saves, and rows of
// seq_len filled by greedy packing of whole samples (or one padded sample per row), each with
// loss-masked targets, per-sample positions and segment ids for attention.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/data/sample_set_file.h"
#include "engine/data/token_windows.h"

namespace megatrain::engine {

// What happens to a sample longer than seq_len + 1 tokens (a row's window).
enum class OverlongPolicy {
  kTruncate,  // keep its first seq_len + 1 tokens (counted)
  kRefuse,    // the run fails naming the sample
};

// "truncate" or "refuse"; InvalidArgument naming the value otherwise.
absl::StatusOr<OverlongPolicy> ParseOverlongPolicy(std::string_view name);

struct SampleBatchOptions {
  int seq_len = 0;
  bool pack = true;              // several whole samples per row; false = one sample per row
  bool train_on_prompt = false;  // every token but a sample's first counts, whatever its mask
  OverlongPolicy overlong = OverlongPolicy::kTruncate;
  double validation_fraction = 0.0;  // the last samples of the set (by index) are held out
  uint64_t seed = 1;
};

// A row is a window of seq_len + 1 token slots, filled with samples back to back: inputs are
// slots [0, seq_len), targets slots [1, seq_len] where the target is the next token OF THE SAME
// SAMPLE and its mask says it counts, else -1 (so never across a sample boundary, never for
// padding). Positions restart at 0 for each sample; segment k is the row's k-th sample, and the
// padding after the last sample (inputs 0) is one more segment of its own.
class SampleBatches : public BatchSource {
 public:
  // Samples with fewer than 2 tokens (nothing to predict) are dropped and counted; overlong ones
  // are truncated and counted, or refused. Fails when no training sample remains, or when
  // validation_fraction > 0 leaves no validation sample.
  static absl::StatusOr<SampleBatches> Create(std::shared_ptr<const SampleSource> samples,
                                              const SampleBatchOptions& options);

  // The next `batch` rows, taking samples from the cursor in the epoch's shuffled order (the
  // order is reshuffled each epoch with the epoch folded into the seed; packing continues across
  // epochs). A read error leaves the cursor where it was.
  absl::StatusOr<WindowBatch> NextTrainBatch(int batch) override;
  // Validation rows, packed once from the validation samples in file order.
  absl::StatusOr<WindowBatch> ValidationBatch(int first, int batch) const override;

  size_t train_windows() const override { return train_samples_.size(); }
  size_t validation_windows() const override { return validation_rows_.size(); }
  uint64_t cursor() const override { return cursor_; }  // samples consumed since the start
  void set_cursor(uint64_t cursor) override { cursor_ = cursor; }

  size_t train_samples() const { return train_samples_.size(); }
  size_t validation_samples() const { return validation_samples_; }
  uint64_t truncated_samples() const { return truncated_; }
  // Of those, the ones whose kept tokens hold no counted target (every one is prompt): they
  // train nothing (0 with train_on_prompt).
  uint64_t truncated_without_targets() const { return truncated_without_targets_; }
  uint64_t dropped_samples() const { return dropped_; }

 private:
  SampleBatches() = default;
  size_t UsedLength(size_t sample) const;
  // The training sample at position `cursor` of the endless epoch sequence.
  size_t TrainSampleAt(uint64_t cursor);
  void Reshuffle(uint64_t epoch);
  // Writes row `row` of `out` from `samples` (global indices, in order).
  absl::Status FillRow(const std::vector<size_t>& samples, int row, WindowBatch* out) const;

  std::shared_ptr<const SampleSource> source_;
  SampleBatchOptions options_;
  std::vector<size_t> train_samples_;
  std::vector<std::vector<size_t>> validation_rows_;
  size_t validation_samples_ = 0;
  std::vector<size_t> order_;  // permutation of train_samples_ for the current epoch
  uint64_t shuffled_epoch_ = ~uint64_t{0};
  uint64_t cursor_ = 0;
  uint64_t truncated_ = 0;
  uint64_t truncated_without_targets_ = 0;
  uint64_t dropped_ = 0;
};

}  // namespace megatrain::engine
