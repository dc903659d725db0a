// RunTraining: one complete training run of a model (random init or a Hugging Face directory)
// on text (fortune/plain files or JSONL, tokenized with bytes or a SentencePiece model) or on
// token files: the data (training_data.h), the trainer, checkpoints and resume
// (run_checkpoints.h), the step loop with evaluation, and progress lines. Used by the daemon's
// job engine, the `train_local` binary (scripts/demo) and the learning test.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/common/input_files.h"
#include "engine/device/device.h"
#include "engine/device/device_options.h"
#include "engine/model/model_config.h"
#include "engine/provenance/lineage.h"
#include "engine/provenance/signing_key.h"
#include "engine/train/trainer.h"

namespace megatrain::engine {

// A user message rendered for a reply (the chat template with the generation prompt).
struct EvalPrompt {
  std::string text;
  std::vector<int32_t> ids;
};

struct TrainingRunOptions {
  // Fortune-format or plain text files, *.jsonl files ({"text": ...} per
  // line), or directories of them.
  std::vector<std::string> text_paths;
  // How text is tokenized: "bytes" or the path of a SentencePiece .model.
  // Documents are separated by its end-of-document id (0 for bytes, the
  // model's eos id otherwise).
  std::string tokenizer = "bytes";
  // Pre-tokenized data instead of text (engine/data/token_file.h): files read
  // as one stream, on demand with pread; token_format is "u16", "u32" or "llmc".
  std::vector<std::string> token_files;
  std::string token_format = "u16";
  // Set when a daemon's tokenizer process turned text_paths (byte tokenizer) into token_files
  // (issue 16, point 6): the documents it counted. The run reads the token files; everything
  // else is the text's, as when text is tokenized in memory: the job's identity (its JSON and
  // the data checksums, so checkpoints written either way resume) and the corpus statistics.
  std::optional<uint64_t> tokenized_text_documents;
  // Supervised fine-tuning on sample-set files (engine/data/sample_set_file.h, docs/data.md)
  // instead of text or token files: samples with loss masks, batched by SampleBatches.
  std::vector<std::string> sft_sample_paths;
  bool pack = true;              // several whole samples per row (attention never crosses them)
  bool train_on_prompt = false;  // count every token but each sample's first, not only masked
  std::string overlong = "truncate";  // a sample over seq_len + 1 tokens: truncate or refuse
  TrainerOptions trainer;
  // A Hugging Face model directory (config.json + safetensors) whose weights
  // start the run instead of a random initialisation; the caller passes its
  // config. Checkpoints are then written in its dtype unless
  // checkpoint_dtype says otherwise.
  std::string init_from_hf_dir;
  std::string checkpoint_dtype;  // "" = the source's dtype (fp32 from scratch), or F32/BF16/F16
  int grad_accumulation = 1;     // micro-batches per optimizer step
  uint64_t steps = 100;
  double validation_fraction = 0.05;
  int eval_every = 50;   // steps; 0 = only at the end
  int eval_batches = 8;  // micro-batches of validation windows
  // A look at the model while it trains (a daemon job's data.eval_prompts): at the run's start
  // and at every evaluation, the greedy reply to each prompt (Sampler::GenerateGreedy,
  // micro_batch_size prompts per forward), ending after one of eval_stop_ids or
  // eval_reply_tokens ids, goes to TrainingObserver::OnEvalReplies. The weights are only read,
  // so training is unchanged; not part of the job's identity (TrainingJobJson).
  std::vector<EvalPrompt> eval_prompts;
  std::vector<int32_t> eval_stop_ids;
  int eval_reply_tokens = 48;
  int64_t eval_vocab_limit = 0;  // ids a reply may use (the tokenizer's size); 0 = all
  uint64_t seed = 1;
  DeviceOptions device;
  // A device the caller owns and shares between runs one at a time (a daemon's); when set, the
  // run uses it instead of creating one from `device`.
  Device* shared_device = nullptr;
  // Devices of this process the run trains on (docs/scale_out.md "Several devices in one
  // process"): micro-batch m of a step on device m % devices, so grad_accumulation must be a
  // multiple. Created from `device` (the CPU device that many times; CUDA ordinals
  // cuda_device_ordinal onwards), or the first `devices` of shared_devices when given (a
  // daemon's; then shared_device is unused). Results do not depend on it.
  int devices = 1;
  std::vector<Device*> shared_devices;
  std::string chrome_trace_path;  // written after the last step when set
  // Checkpoints (engine/checkpoint): written under checkpoint_dir every
  // checkpoint_every steps and after the last step; empty = none.
  std::string checkpoint_dir;
  int checkpoint_every = 0;  // steps; 0 = only after the last step
  int keep_last = 0;         // checkpoints kept; 0 = all
  // Continue from the newest checkpoint in checkpoint_dir when there is one
  // (refused if the model, the job or the data files differ).
  bool resume = false;
  // Resume even when a data file's checksum differs from the checkpoint's: the caller checked
  // the data itself and recorded the change (a daemon job resumed with --allow-data-change).
  bool allow_changed_data_files = false;
  // Provenance of checkpoints (engine/provenance): the job's lineage, hashed
  // by the daemon on the job's first run; nullopt = RunTraining hashes the inputs itself
  // when it writes checkpoints. With a signer, every record is signed.
  std::optional<provenance::Lineage> lineage;
  std::shared_ptr<const provenance::SigningKey> signer;
  // The inputs as descriptors a daemon opened and checked when the job started (issue 16,
  // point 2): when set, every input (text, token files, tokenizer, the HF directory's files) is
  // read through them, so a path swapped after the check is never read. Not owned: the daemon's
  // runner keeps the set alive for the whole run. Null (CLI tools) reads by path.
  const InputFiles* inputs = nullptr;
  // With a communicator: before every step the ranks agree on their observers' requests (one
  // SumInt64): any rank's stop stops them all, with a checkpoint when every stopping rank asks
  // for one (ZeRO-1 included: the shards are written together), and rank 0's checkpoint-now
  // request checkpoints that step on all (reported once written: the other ranks wait for rank
  // 0 at the next agreement, within the communicator's collective timeout). For ranks whose
  // observers all hear the same requests (a daemon's signals forwarded by mpirun to every
  // rank). Off: each rank's observer is its own, as under a plain mpirun.
  bool agree_on_requests = false;
};

// Whether the run's data is identified as text (text_paths + tokenizer), tokenized in memory
// or by a daemon's tokenizer process, rather than as token files.
inline bool RunDataIsText(const TrainingRunOptions& o) {
  return o.sft_sample_paths.empty() &&
         (o.token_files.empty() || o.tokenized_text_documents.has_value());
}

// Whether the run trains on SFT sample sets.
inline bool RunDataIsSamples(const TrainingRunOptions& o) { return !o.sft_sample_paths.empty(); }

// The settings that determine the run's results, as a JSON object (sorted
// keys): stored in each checkpoint and compared on resume.
std::string TrainingJobJson(const TrainingRunOptions& options);

// Where the run's executor sums a step's gradients (trainer.executor.gradient_accumulation):
// GradientAccumulationForRun (streaming_executor.h) for this run's micro-batches per device.
absl::StatusOr<GradientAccumulation> RunGradientAccumulation(const TrainingRunOptions& options);

// A Llama config of about 10M parameters over the 256-byte vocabulary.
ModelConfig TinyTextModelConfig();

struct TrainingRunResult {
  double unigram_entropy_nats = 0;  // of a text run's training tokens (the bar to beat); else 0
  double initial_validation_loss = 0;
  double final_validation_loss = 0;
  double final_train_loss = 0;
  double tokens_per_second = 0;    // median over steps after the first
  uint64_t resumed_from_step = 0;  // 0 = started fresh
  std::string last_checkpoint;     // path of the newest checkpoint written
  int64_t parameters = 0;
  // Steps this run took (not counting a resumed-from checkpoint's). A run keeps no report per
  // step (a daemon job can run millions of steps); observers see each in OnStep.
  uint64_t steps_run = 0;
  // TrainerOptions::speculative_update: of those steps, the ones whose speculative update became
  // the step's update and the ones that discarded it (clipped or skipped steps).
  uint64_t speculations_committed = 0;
  uint64_t speculations_discarded = 0;
};

// The greedy reply to one of TrainingRunOptions::eval_prompts at an evaluation.
struct EvalReplyReport {
  int index = 0;             // into eval_prompts
  std::string prompt;        // its text
  std::vector<int32_t> ids;  // generated; the stop id included when one ended the reply
  bool stopped = false;      // ended at a stop id (false: eval_reply_tokens reached)
  std::string text;          // empty from the engine; filled by an observer that decodes
};

// What a caller sees of a run while it goes (a daemon's job runner, a CLI).
class TrainingObserver {
 public:
  virtual ~TrainingObserver() = default;
  // One human-readable line; `keep` = a line worth keeping (not overwritten).
  virtual void OnLine(const std::string& line, bool keep) { (void)line, (void)keep; }
  // After every optimizer step, with the latest validation loss (at first, the
  // untrained model's).
  virtual void OnStep(const StepReport& report, double validation_loss) {
    (void)report, (void)validation_loss;
  }
  // Polled between steps and between the generated tokens of an eval round (eval_prompts):
  // true stops the run early with CANCELLED (an eval round asked to stop ends unreported).
  virtual bool ShouldStop() { return false; }
  // Polled when stopping early: true = write a checkpoint of the last
  // completed step first (a pause or a daemon shutdown, not a cancel).
  virtual bool CheckpointBeforeStop() { return false; }
  // Polled after every step: true = start a checkpoint of this step now
  // (besides the checkpoint_every schedule). Needs checkpoint_dir.
  virtual bool ShouldCheckpoint() { return false; }
  // A checkpoint of `step` is committed at `path`.
  virtual void OnCheckpoint(uint64_t step, const std::string& path) { (void)step, (void)path; }
  // The replies to the eval prompts after `step` (the run's first step - 1: before it), in
  // prompt order; between steps, after the step's evaluation and before its OnStep.
  virtual void OnEvalReplies(uint64_t step, std::vector<EvalReplyReport>& replies) {
    (void)step, (void)replies;
  }
};

absl::StatusOr<TrainingRunResult> RunTraining(const ModelConfig& config,
                                               const TrainingRunOptions& options,
                                               TrainingObserver& observer);

// Convenience: only the lines.
absl::StatusOr<TrainingRunResult> RunTraining(
    const ModelConfig& config, const TrainingRunOptions& options,
    const std::function<void(const std::string&, bool keep)>& progress);

}  // namespace megatrain::engine
