// The data side of a training run: the token stream (token files read in place, or text
// tokenized in memory) and its train/validation windows, or SFT sample sets and their packed
// rows; and what the run reports about it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/data/sample_batches.h"
#include "engine/data/token_windows.h"
#include "engine/model/model_config.h"
#include "engine/data/token_file.h"
#include "engine/train/training_run.h"

namespace megatrain::engine {

struct TrainingData {
  std::shared_ptr<const TokenSource> source;  // null for sample sets
  std::unique_ptr<BatchSource> batches;       // TokenWindows, or SampleBatches
  const SampleBatches* samples = nullptr;     // `batches` when the run trains on sample sets
  size_t documents = 0;              // of text (in memory or tokenized by a daemon); 0 for token files
  double unigram_entropy_nats = 0;   // of the training part of a text corpus (RunDataIsText); else 0
};

// Opens the job's token files (ids checked against the model's vocabulary) or tokenizes its
// text with its tokenizer, and windows the stream by seq_len and validation_fraction; or opens
// its sample sets (V checked against the vocabulary) and batches them (pack, train_on_prompt,
// overlong, split by sample).
absl::StatusOr<TrainingData> PrepareTrainingData(const ModelConfig& config,
                                                 const TrainingRunOptions& options);

// The validation micro-batches evaluated after the steps that evaluate: the first
// min(validation windows, batches x micro) windows, each once, in micro-batches of `micro` (the
// last one's rows past them count no target); none when the run holds no validation windows
// out. Read errors as NextTrainBatch.
absl::StatusOr<std::vector<WindowBatch>> ValidationBatches(const BatchSource& windows,
                                                           int batches, int micro);

// The executor's view of a batch's positions and segments (empty = the defaults); segments only
// `with_segments` (packed rows: one sample per row needs none, its padding comes after it).
TokenLayout LayoutOf(const WindowBatch& batch, bool with_segments = true);

// Whether the run's micro-batches carry segment ids (ExecutorOptions::segment_ids).
bool RunUsesSegmentIds(const TrainingRunOptions& options);

}  // namespace megatrain::engine
