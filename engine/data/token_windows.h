// Training windows over one token stream: a train/validation split, windows of
// seq_len+1 tokens (inputs and next-token targets), a deterministic shuffle by
// seed, and a cursor that a checkpoint can save.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/data/token_file.h"

namespace megatrain::engine {

struct WindowBatch {
  int batch = 0;
  int seq_len = 0;
  std::vector<int32_t> inputs;   // [batch, seq_len]
  std::vector<int32_t> targets;  // [batch, seq_len]; negative = ignored
  // Rows that hold several samples (sample_batches.h); both empty for plain windows, whose token
  // t sits at position t % seq_len in one segment per row.
  std::vector<int32_t> positions;  // [batch, seq_len]: position of each token within its sample
  // [batch, seq_len]: non-decreasing along each row; a query sees only keys of its own segment.
  std::vector<int32_t> segments;
};

// Where a training run's micro-batches come from: windows of a token stream (TokenWindows) or
// rows of SFT samples (SampleBatches). The cursor is what a checkpoint saves to resume.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual absl::StatusOr<WindowBatch> NextTrainBatch(int batch) = 0;
  // Validation rows [first, first + batch), wrapping around; needs validation_windows() > 0.
  virtual absl::StatusOr<WindowBatch> ValidationBatch(int first, int batch) const = 0;
  virtual size_t train_windows() const = 0;       // windows, or training samples
  virtual size_t validation_windows() const = 0;  // validation rows
  virtual uint64_t cursor() const = 0;
  virtual void set_cursor(uint64_t cursor) = 0;
};

class TokenWindows : public BatchSource {
 public:
  // Splits `tokens` at (1 - validation_fraction) of its length; windows start
  // every seq_len tokens. Fails when either side has no whole window.
  static absl::StatusOr<TokenWindows> Create(std::vector<int32_t> tokens, int seq_len,
                                             double validation_fraction, uint64_t seed);
  // The same over any token source (e.g. memory-mapped TokenFiles), read in place.
  static absl::StatusOr<TokenWindows> Create(std::shared_ptr<const TokenSource> tokens, int seq_len,
                                             double validation_fraction, uint64_t seed);

  // The next `batch` training windows in shuffled order; the order is
  // reshuffled (with the epoch number folded into the seed) at each epoch. A token file cut
  // short under the run fails the read (DATA_LOSS naming it); the cursor then stays where it was.
  absl::StatusOr<WindowBatch> NextTrainBatch(int batch) override;

  // Validation windows [first, first + batch), wrapping around; needs validation_windows() > 0.
  absl::StatusOr<WindowBatch> ValidationBatch(int first, int batch) const override;

  size_t train_windows() const override { return train_starts_.size(); }
  size_t validation_windows() const override { return validation_starts_.size(); }
  uint64_t cursor() const override { return cursor_; }
  void set_cursor(uint64_t cursor) override;

 private:
  TokenWindows() = default;
  void Reshuffle(uint64_t epoch);
  absl::Status Fill(size_t start, int row, WindowBatch* out) const;

  std::shared_ptr<const TokenSource> tokens_;
  int seq_len_ = 0;
  uint64_t seed_ = 0;
  std::vector<size_t> train_starts_;
  std::vector<size_t> validation_starts_;
  std::vector<size_t> order_;  // permutation of train_starts_ for the current epoch
  uint64_t cursor_ = 0;        // windows consumed since the start of training
  uint64_t shuffled_epoch_ = ~uint64_t{0};
};

}  // namespace megatrain::engine
