// Token stream, windows and corpus statistics of a training run (see training_data.h).
#include "engine/train/training_data.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/data/text_corpus.h"
#include "engine/data/text_tokenizer.h"
#include "engine/data/token_file.h"

namespace megatrain::engine {
namespace {

// Of the first `count` tokens, read in chunks, so a token file is never held whole.
absl::StatusOr<double> UnigramEntropy(const TokenSource& tokens, size_t count, int vocab) {
  constexpr size_t kChunk = size_t{1} << 20;
  std::vector<double> counts(static_cast<size_t>(vocab), 0.0);
  std::vector<int32_t> chunk;
  for (size_t start = 0; start < count; start += kChunk) {
    chunk.resize(std::min(kChunk, count - start));
    if (absl::Status s = tokens.Read(start, chunk.size(), chunk.data()); !s.ok()) return s;
    for (int32_t t : chunk) counts[static_cast<size_t>(t)] += 1;
  }
  double h = 0;
  for (double c : counts) {
    if (c > 0) {
      const double p = c / static_cast<double>(count);
      h -= p * std::log(p);
    }
  }
  return h;
}

absl::StatusOr<std::shared_ptr<const TokenSource>> OpenTokenFiles(
    const ModelConfig& config, const TrainingRunOptions& options) {
  absl::StatusOr<TokenFileFormat> format = ParseTokenFileFormat(options.token_format);
  if (!format.ok()) return format.status();
  absl::StatusOr<TokenFiles> files = TokenFiles::Open(options.token_files, *format, options.inputs);
  if (!files.ok()) return files.status();
  absl::StatusOr<int32_t> max_token = files->MaxToken();
  if (!max_token.ok()) return max_token.status();
  if (*max_token >= config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("token files hold id ", *max_token,
                                                   ", outside vocab_size=", config.vocab_size));
  }
  return std::make_shared<TokenFiles>(std::move(*files));
}

struct TokenizedText {
  std::vector<int32_t> tokens;
  size_t documents = 0;
};

absl::StatusOr<TokenizedText> TokenizeText(const ModelConfig& config,
                                           const TrainingRunOptions& options) {
  absl::StatusOr<std::unique_ptr<TextTokenizer>> tokenizer = CreateTextTokenizer(options.tokenizer, options.inputs);
  if (!tokenizer.ok()) return tokenizer.status();
  if (config.vocab_size < (*tokenizer)->vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vocab_size=", config.vocab_size, " is smaller than the vocabulary of tokenizer '",
        options.tokenizer, "' (", (*tokenizer)->vocab_size(), ")"));
  }
  absl::StatusOr<std::vector<std::string>> docs = LoadTextDocuments(options.text_paths, options.inputs);
  if (!docs.ok()) return docs.status();
  absl::StatusOr<std::vector<int32_t>> encoded = TokenizeDocuments(*docs, **tokenizer);
  if (!encoded.ok()) return encoded.status();
  return TokenizedText{*std::move(encoded), docs->size()};
}

}  // namespace

absl::StatusOr<TrainingData> PrepareSampleData(const ModelConfig& config,
                                               const TrainingRunOptions& options) {
  absl::StatusOr<OverlongPolicy> overlong = ParseOverlongPolicy(options.overlong);
  if (!overlong.ok()) return overlong.status();
  absl::StatusOr<SampleSetFiles> files = SampleSetFiles::Open(options.sft_sample_paths, options.inputs);
  if (!files.ok()) return files.status();
  if (files->vocab_bound() > static_cast<uint64_t>(config.vocab_size)) {
    return absl::InvalidArgumentError(absl::StrCat("sample sets hold token id ",
                                                   files->vocab_bound() - 1,
                                                   ", outside vocab_size=", config.vocab_size));
  }
  SampleBatchOptions o;
  o.seq_len = options.trainer.seq_len;
  o.pack = options.pack;
  o.train_on_prompt = options.train_on_prompt;
  o.overlong = *overlong;
  o.validation_fraction = options.validation_fraction;
  o.seed = options.seed;
  absl::StatusOr<SampleBatches> batches =
      SampleBatches::Create(std::make_shared<SampleSetFiles>(*std::move(files)), o);
  if (!batches.ok()) return batches.status();
  TrainingData data;
  auto owned = std::make_unique<SampleBatches>(*std::move(batches));
  data.samples = owned.get();
  data.batches = std::move(owned);
  return data;
}

absl::StatusOr<TrainingData> PrepareTrainingData(const ModelConfig& config,
                                                 const TrainingRunOptions& options) {
  if (RunDataIsSamples(options)) return PrepareSampleData(config, options);
  std::shared_ptr<const TokenSource> source;
  size_t documents = 0;
  if (!options.token_files.empty()) {
    absl::StatusOr<std::shared_ptr<const TokenSource>> files = OpenTokenFiles(config, options);
    if (!files.ok()) return files.status();
    source = *std::move(files);
    documents = static_cast<size_t>(options.tokenized_text_documents.value_or(0));
  } else {
    absl::StatusOr<TokenizedText> text = TokenizeText(config, options);
    if (!text.ok()) return text.status();
    documents = text->documents;
    source = std::make_shared<VectorTokens>(std::move(text->tokens));
  }
  double entropy = 0;
  if (RunDataIsText(options)) {
    // The bar to beat: the entropy of the training part's unigram distribution.
    const size_t train_tokens = static_cast<size_t>(static_cast<double>(source->size()) *
                                                    (1.0 - options.validation_fraction));
    absl::StatusOr<double> h =
        UnigramEntropy(*source, train_tokens, static_cast<int>(config.vocab_size));
    if (!h.ok()) return h.status();
    entropy = *h;
  }
  absl::StatusOr<TokenWindows> windows = TokenWindows::Create(
      source, options.trainer.seq_len, options.validation_fraction, options.seed);
  if (!windows.ok()) return windows.status();
  TrainingData data;
  data.source = std::move(source);
  data.batches = std::make_unique<TokenWindows>(*std::move(windows));
  data.documents = documents;
  data.unigram_entropy_nats = entropy;
  return data;
}

TokenLayout LayoutOf(const WindowBatch& batch, bool with_segments) {
  return TokenLayout{batch.positions.empty() ? nullptr : batch.positions.data(),
                     batch.segments.empty() || !with_segments ? nullptr : batch.segments.data()};
}

bool RunUsesSegmentIds(const TrainingRunOptions& options) {
  return RunDataIsSamples(options) && options.pack;
}

absl::StatusOr<std::vector<WindowBatch>> ValidationBatches(const BatchSource& windows,
                                                           int batches, int micro) {
  std::vector<WindowBatch> out;
  const size_t rows = windows.validation_windows();
  if (rows == 0 || batches <= 0 || micro <= 0) return out;
  // Each held-out row at most once, so the same weights and data give the same validation loss
  // whatever the micro-batch (a few rows were otherwise repeated unevenly to fill the batches):
  // the rows of the last micro-batch past them wrap around and count no target.
  const size_t wanted = std::min(rows, static_cast<size_t>(batches) * static_cast<size_t>(micro));
  for (size_t first = 0; first < wanted; first += static_cast<size_t>(micro)) {
    absl::StatusOr<WindowBatch> batch = windows.ValidationBatch(static_cast<int>(first), micro);
    if (!batch.ok()) return batch.status();
    const size_t seq = static_cast<size_t>(batch->seq_len);
    for (size_t r = wanted - first; r < static_cast<size_t>(micro); ++r) {
      std::fill(batch->targets.begin() + static_cast<std::ptrdiff_t>(r * seq),
                batch->targets.begin() + static_cast<std::ptrdiff_t>((r + 1) * seq), -1);
    }
    out.push_back(*std::move(batch));
  }
  return out;
}

}  // namespace megatrain::engine
