// Local text training run (see text_training.h).
#include "engine/train/text_training.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "engine/checkpoint/async_checkpoint_writer.h"
#include "engine/checkpoint/checkpoint_directory.h"
#include "engine/checkpoint/checkpoint_reader.h"
#include "engine/checkpoint/checkpoint_writer.h"
#include "engine/data/byte_tokenizer.h"
#include "engine/data/text_corpus.h"
#include "engine/data/text_tokenizer.h"
#include "engine/data/token_file.h"
#include "engine/data/token_windows.h"
#include "engine/device/device_factory.h"
#include "engine/model/hf_loader.h"
#include "engine/model/parameter_layout.h"
#include "engine/model/safetensors_dtype.h"
#include "engine/provenance/record.h"

namespace megatrain::engine {
namespace {

double UnigramEntropy(absl::Span<const int32_t> tokens, int vocab) {
  std::vector<double> counts(static_cast<size_t>(vocab), 0.0);
  for (int32_t t : tokens) counts[t] += 1;
  double h = 0;
  for (double c : counts) {
    if (c > 0) {
      const double p = c / static_cast<double>(tokens.size());
      h -= p * std::log(p);
    }
  }
  return h;
}

std::string FormatDuration(double seconds) {
  const int s = static_cast<int>(std::lround(std::max(0.0, seconds)));
  return s >= 60 ? absl::StrFormat("%dm%02ds", s / 60, s % 60) : absl::StrFormat("%ds", s);
}

// Names the first top-level key whose value differs between two JSON objects.
std::string FirstDifferentKey(const std::string& a, const std::string& b) {
  const nlohmann::json ja = nlohmann::json::parse(a, nullptr, false);
  const nlohmann::json jb = nlohmann::json::parse(b, nullptr, false);
  if (!ja.is_object() || !jb.is_object()) return "(unparsable)";
  for (auto it = jb.begin(); it != jb.end(); ++it) {
    auto other = ja.find(it.key());
    if (other == ja.end() || *other != *it) {
      return absl::StrCat(it.key(), ": checkpoint has ",
                          other == ja.end() ? "nothing" : other->dump(), ", the job has ",
                          it->dump());
    }
  }
  for (auto it = ja.begin(); it != ja.end(); ++it) {
    if (!jb.contains(it.key())) return absl::StrCat(it.key(), ": not set by the job");
  }
  return "(none)";
}

// The lineage (given, or hashed now: base model, data, tokenizer), the
// origin of the run's first checkpoint and the signer.
absl::StatusOr<std::shared_ptr<const provenance::ProvenanceContext>> MakeProvenanceContext(
    const TextTrainingOptions& options, const std::string& job_json,
    const std::vector<std::string>& data_and_tokenizer_files) {
  auto context = std::make_shared<provenance::ProvenanceContext>();
  if (options.lineage.has_value()) {
    context->lineage = *options.lineage;
  } else {
    provenance::Lineage& l = context->lineage;
    l.job_spec_json = job_json;
    l.device_kind = std::string(DeviceKindName(options.device.kind));
    if (!options.init_from_hf_dir.empty()) {
      absl::StatusOr<std::vector<provenance::InputFile>> base =
          provenance::HashInputs(provenance::kRoleBaseModel, {options.init_from_hf_dir});
      if (!base.ok()) return base.status();
      l.inputs = *std::move(base);
    }
    for (const std::string& f : data_and_tokenizer_files) {
      const bool tokenizer = options.token_files.empty() && f == options.tokenizer;
      absl::StatusOr<std::vector<provenance::InputFile>> hashed = provenance::HashInputs(
          tokenizer ? provenance::kRoleTokenizer : provenance::kRoleData, {f});
      if (!hashed.ok()) return hashed.status();
      l.inputs.insert(l.inputs.end(), hashed->begin(), hashed->end());
    }
  }
  context->origin =
      options.init_from_hf_dir.empty()
          ? provenance::RandomInitOrigin(options.seed)
          : provenance::BaseModelOrigin(options.init_from_hf_dir, context->lineage.inputs);
  context->signer = options.signer;
  return std::shared_ptr<const provenance::ProvenanceContext>(std::move(context));
}

}  // namespace

std::string TextTrainingJobJson(const TextTrainingOptions& o) {
  const TrainerOptions& t = o.trainer;
  const nlohmann::json j = {
      {"kind", "text"},
      {"init_from_hf_dir", o.init_from_hf_dir},
      {"text_paths", o.token_files.empty() ? o.text_paths : std::vector<std::string>()},
      {"token_files", o.token_files},
      {"token_format", o.token_files.empty() ? "" : o.token_format},
      {"tokenizer", o.token_files.empty() ? o.tokenizer : ""},
      {"steps", o.steps},
      {"grad_accumulation", o.grad_accumulation},
      {"validation_fraction", o.validation_fraction},
      {"seed", o.seed},
      {"micro_batch_size", t.micro_batch_size},
      {"seq_len", t.seq_len},
      {"head_chunk", t.head_chunk},
      {"lr",
       {{"peak_lr", t.lr.peak_lr},
        {"warmup_steps", t.lr.warmup_steps},
        {"cosine", t.lr.cosine},
        {"total_steps", t.lr.total_steps},
        {"min_lr_ratio", t.lr.min_lr_ratio}}},
      {"beta1", t.beta1},
      {"beta2", t.beta2},
      {"eps", t.eps},
      {"weight_decay", t.weight_decay},
      {"grad_clip", t.grad_clip},
      {"max_consecutive_skips", t.max_consecutive_skips},
      {"blas_threads", t.blas_threads},
  };
  return j.dump();
}

ModelConfig TinyTextModelConfig() {
  ModelConfig c;
  c.family = ModelFamily::kLlama;
  c.vocab_size = ByteTokenizer::kVocabSize;
  c.hidden_size = 384;
  c.intermediate_size = 1024;
  c.num_hidden_layers = 6;
  c.num_attention_heads = 6;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.max_position_embeddings = 1024;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = false;
  return c;
}

absl::StatusOr<TextTrainingResult> TrainOnText(
    const ModelConfig& config, const TextTrainingOptions& options,
    const std::function<void(const std::string&, bool)>& progress) {
  class LineObserver : public TrainingObserver {
   public:
    explicit LineObserver(const std::function<void(const std::string&, bool)>& f) : f_(f) {}
    void OnLine(const std::string& line, bool keep) override { f_(line, keep); }

   private:
    const std::function<void(const std::string&, bool)>& f_;
  };
  LineObserver observer(progress);
  return TrainOnText(config, options, observer);
}

absl::StatusOr<TextTrainingResult> TrainOnText(const ModelConfig& config,
                                               const TextTrainingOptions& options,
                                               TrainingObserver& observer) {
  auto progress = [&observer](const std::string& line, bool keep) { observer.OnLine(line, keep); };
  if (options.grad_accumulation < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("grad_accumulation=", options.grad_accumulation, " must be >= 1"));
  }
  const int seq = options.trainer.seq_len;
  const int micro = options.trainer.micro_batch_size;
  double unigram_entropy = 0;  // text mode only: of the training part of the tokenized corpus
  size_t documents = 0;
  std::shared_ptr<const TokenSource> source;
  if (!options.token_files.empty()) {
    absl::StatusOr<TokenFileFormat> format = ParseTokenFileFormat(options.token_format);
    if (!format.ok()) return format.status();
    absl::StatusOr<TokenFiles> files =
        TokenFiles::Open(options.token_files, *format, options.inputs);
    if (!files.ok()) return files.status();
    const int32_t max_token = files->MaxToken();
    if (max_token >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token files hold id ", max_token,
                                                     ", outside vocab_size=", config.vocab_size));
    }
    source = std::make_shared<TokenFiles>(std::move(*files));
  } else {
    absl::StatusOr<std::unique_ptr<TextTokenizer>> tokenizer =
        CreateTextTokenizer(options.tokenizer, options.inputs);
    if (!tokenizer.ok()) return tokenizer.status();
    if (config.vocab_size < (*tokenizer)->vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "vocab_size=", config.vocab_size, " is smaller than the vocabulary of tokenizer '",
          options.tokenizer, "' (", (*tokenizer)->vocab_size(), ")"));
    }
    absl::StatusOr<std::vector<std::string>> docs =
        LoadTextDocuments(options.text_paths, options.inputs);
    if (!docs.ok()) return docs.status();
    absl::StatusOr<std::vector<int32_t>> encoded = TokenizeDocuments(*docs, **tokenizer);
    if (!encoded.ok()) return encoded.status();
    documents = docs->size();
    docs->clear();
    docs->shrink_to_fit();
    const auto train_part = static_cast<size_t>(static_cast<double>(encoded->size()) *
                                                (1.0 - options.validation_fraction));
    unigram_entropy = UnigramEntropy(absl::MakeConstSpan(encoded->data(), train_part),
                                     static_cast<int>(config.vocab_size));
    // Moved, not copied: the corpus is held once, as 4-byte tokens (issue 16, point 6).
    source = std::make_shared<VectorTokens>(*std::move(encoded));
  }
  const size_t token_count = source->size();
  absl::StatusOr<TokenWindows> windows =
      TokenWindows::Create(source, seq, options.validation_fraction, options.seed);
  if (!windows.ok()) return windows.status();

  std::unique_ptr<Device> owned_device;
  Device* device = options.shared_device;
  if (device == nullptr) {
    absl::StatusOr<std::unique_ptr<Device>> created = CreateDevice(options.device);
    if (!created.ok()) return created.status();
    owned_device = std::move(*created);
    device = owned_device.get();
  }
  if (absl::Status health = device->health(); !health.ok()) return health;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      Trainer::Create(*device, config, options.trainer);
  if (!trainer.ok()) return trainer.status();
  if (!(*trainer)->placement_table().empty()) {
    observer.OnLine("memory placement:\n" + (*trainer)->placement_table(), true);
  }
  SafetensorsDtype checkpoint_dtype = SafetensorsDtype::kF32;
  if (options.init_from_hf_dir.empty()) {
    (*trainer)->InitializeRandom(options.seed);
  } else {
    if (absl::Status s = (*trainer)->LoadHfWeights(options.init_from_hf_dir, options.inputs);
        !s.ok())
      return s;
    absl::StatusOr<SafetensorsDtype> source =
        HfWeightsDtype(options.init_from_hf_dir, options.inputs);
    if (!source.ok()) return source.status();
    checkpoint_dtype = *source;
  }
  if (!options.checkpoint_dtype.empty()) {
    std::optional<SafetensorsDtype> wanted = ParseSafetensorsDtype(options.checkpoint_dtype);
    if (!wanted.has_value() ||
        (*wanted != SafetensorsDtype::kF32 && *wanted != SafetensorsDtype::kBF16 &&
         *wanted != SafetensorsDtype::kF16)) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint_dtype=", options.checkpoint_dtype, " must be F32, BF16 or F16"));
    }
    checkpoint_dtype = *wanted;
  } else if (checkpoint_dtype != SafetensorsDtype::kBF16 &&
             checkpoint_dtype != SafetensorsDtype::kF16) {
    checkpoint_dtype = SafetensorsDtype::kF32;  // F64 sources and the like: fp32
  }

  TextTrainingResult result;
  const std::string job_json = TextTrainingJobJson(options);
  std::vector<DataFileRecord> data_files;
  std::shared_ptr<const provenance::ProvenanceContext> provenance_context;
  uint64_t first_step = 1;
  if (!options.checkpoint_dir.empty()) {
    absl::StatusOr<std::vector<std::string>> files =
        options.token_files.empty() ? ExpandCorpusFiles(options.text_paths)
                                    : absl::StatusOr<std::vector<std::string>>(options.token_files);
    if (!files.ok()) return files.status();
    // A different SentencePiece model would silently change every token.
    if (options.token_files.empty() && options.tokenizer != "bytes") {
      files->push_back(options.tokenizer);
    }
    absl::StatusOr<std::vector<DataFileRecord>> sums = ChecksumDataFiles(*files, options.inputs);
    if (!sums.ok()) return sums.status();
    data_files = std::move(*sums);
    absl::StatusOr<std::shared_ptr<const provenance::ProvenanceContext>> context =
        MakeProvenanceContext(options, job_json, *files);
    if (!context.ok()) return context.status();
    provenance_context = *std::move(context);
  }
  if (!options.checkpoint_dir.empty() && options.resume) {
    absl::StatusOr<std::optional<std::string>> latest = LatestCheckpoint(options.checkpoint_dir);
    if (!latest.ok()) return latest.status();
    if (latest->has_value()) {
      absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(**latest, **trainer);
      if (!loaded.ok()) return loaded.status();
      if (absl::Status s = CheckDataFilesMatch(loaded->manifest.data_files, data_files);
          !s.ok() && !options.allow_changed_data_files) {
        return absl::FailedPreconditionError(absl::StrCat(**latest, ": ", s.message()));
      }
      if (loaded->state.job_json != job_json) {
        return absl::FailedPreconditionError(
            absl::StrCat(**latest, ": the job differs from the checkpoint's: ",
                         FirstDifferentKey(loaded->state.job_json, job_json)));
      }
      windows->set_cursor(loaded->state.data_cursor);
      first_step = loaded->state.progress.step + 1;
      result.resumed_from_step = loaded->state.progress.step;
      progress(absl::StrFormat("resumed from %s at step %d", **latest, loaded->state.progress.step),
               true);
    }
  }
  // Checkpoints are written while the next step runs; the last one is waited for.
  AsyncCheckpointWriter checkpoint_writer;
  uint64_t pending_checkpoint_step = 0;
  auto collect_checkpoint = [&]() -> absl::Status {
    absl::StatusOr<std::optional<std::string>> written = checkpoint_writer.Wait();
    if (!written.ok()) return written.status();
    if (written->has_value()) {
      result.last_checkpoint = **written;
      observer.OnCheckpoint(pending_checkpoint_step, result.last_checkpoint);
    }
    return absl::OkStatus();
  };
  auto save_checkpoint = [&]() -> absl::Status {
    CheckpointRunInfo run;
    run.data_cursor = windows->cursor();
    run.seed = options.seed;
    run.job_json = job_json;
    run.data_files = data_files;
    run.provenance = provenance_context;
    CheckpointOptions checkpoint_options;
    checkpoint_options.keep_last = options.keep_last;
    checkpoint_options.model_dtype = checkpoint_dtype;
    if (absl::Status s = collect_checkpoint(); !s.ok()) return s;
    pending_checkpoint_step = (*trainer)->steps_done();
    return checkpoint_writer.Start(**trainer, options.checkpoint_dir, run, checkpoint_options);
  };
  result.parameters = (*trainer)->layout().parameter_count();
  result.unigram_entropy_nats = unigram_entropy;
  progress(absl::StrFormat("model: %d parameters, %d layers, d=%d; data: %d documents, %d tokens "
                           "(%d train / %d validation windows of %d); unigram entropy %.3f nats",
                           result.parameters, config.num_hidden_layers, config.hidden_size,
                           documents, token_count, windows->train_windows(),
                           windows->validation_windows(), seq, result.unigram_entropy_nats),
           true);

  std::vector<WindowBatch> validation;
  for (int b = 0; b < options.eval_batches; ++b) {
    validation.push_back(windows->ValidationBatch(b * micro, micro));
  }
  auto evaluate = [&]() -> absl::StatusOr<double> {
    std::vector<const int32_t*> in, tg;
    for (const WindowBatch& b : validation) {
      in.push_back(b.inputs.data());
      tg.push_back(b.targets.data());
    }
    return (*trainer)->Evaluate(in, tg);
  };
  absl::StatusOr<double> initial = evaluate();
  if (!initial.ok()) return initial.status();
  result.initial_validation_loss = *initial;
  double validation_loss = *initial;
  progress(absl::StrFormat("step 0/%d  validation loss %.4f", options.steps, *initial), true);

  std::vector<double> speeds;
  double elapsed = 0;
  for (uint64_t step = first_step; step <= options.steps; ++step) {
    if (observer.ShouldStop()) {
      const bool keep =
          !options.checkpoint_dir.empty() && step > first_step && observer.CheckpointBeforeStop();
      if (keep) {
        if (absl::Status s = save_checkpoint(); !s.ok()) return s;
      }
      if (absl::Status s = collect_checkpoint(); !s.ok()) return s;
      return absl::CancelledError(
          absl::StrCat("stopped before step ", step, keep ? " (checkpoint written)" : ""));
    }
    std::vector<WindowBatch> batches;
    std::vector<const int32_t*> in, tg;
    for (int m = 0; m < options.grad_accumulation; ++m)
      batches.push_back(windows->NextTrainBatch(micro));
    for (const WindowBatch& b : batches) {
      in.push_back(b.inputs.data());
      tg.push_back(b.targets.data());
    }
    absl::StatusOr<StepReport> report = (*trainer)->Step(in, tg);
    if (!report.ok()) return report.status();
    elapsed += report->step_seconds;
    if (step > first_step) speeds.push_back(report->tokens_per_second);
    result.final_train_loss = report->loss;
    const bool evaluate_now =
        step == options.steps || (options.eval_every > 0 && step % options.eval_every == 0);
    if (evaluate_now) {
      absl::StatusOr<double> v = evaluate();
      if (!v.ok()) return v.status();
      validation_loss = *v;
    }
    const bool checkpoint_now =
        !options.checkpoint_dir.empty() &&
        (step == options.steps ||
         (options.checkpoint_every > 0 && step % options.checkpoint_every == 0) ||
         observer.ShouldCheckpoint());
    if (checkpoint_now) {
      if (absl::Status s = save_checkpoint(); !s.ok()) return s;
      if (step == options.steps) {
        if (absl::Status s = collect_checkpoint(); !s.ok()) return s;
      }
    }
    const double eta = elapsed / static_cast<double>(step - first_step + 1) *
                       static_cast<double>(options.steps - step);
    progress(absl::StrFormat("step %d/%d  loss %.4f  val %.4f  lr %.2e  |g| %.3f  %.0f tok/s  "
                             "eta %s%s%s",
                             step, options.steps, report->loss, validation_loss,
                             report->learning_rate, report->grad_norm, report->tokens_per_second,
                             FormatDuration(eta), report->skipped ? "  (skipped: non-finite)" : "",
                             checkpoint_now ? "  (checkpoint started)" : ""),
             evaluate_now || checkpoint_now);
    if (!checkpoint_now && checkpoint_writer.Idle()) {
      // Report a checkpoint that finished beside this step.
      if (absl::Status s = collect_checkpoint(); !s.ok()) return s;
    }
    observer.OnStep(*report, validation_loss);
    if (options.keep_step_reports) result.reports.push_back(std::move(*report));
  }
  result.final_validation_loss = validation_loss;
  if (!speeds.empty()) {
    std::nth_element(speeds.begin(), speeds.begin() + speeds.size() / 2, speeds.end());
    result.tokens_per_second = speeds[speeds.size() / 2];
  }
  if (!options.chrome_trace_path.empty()) {
    std::ofstream out(options.chrome_trace_path);
    out << device->timeline().ToChromeTraceJson();
    if (!out) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot write chrome trace to '", options.chrome_trace_path, "'"));
    }
  }
  return result;
}

}  // namespace megatrain::engine
