// ValidatedJob: what job-spec validation turns a JobSpec into (the model, the engine's run
// options, the plan), and the documented defaults of the fields a spec may leave unset.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/train/training_run.h"
#include "proto/megatrain.pb.h"

namespace megatrain::service {

// `config_json_path` value that selects the built-in ~10M-parameter text model.
inline constexpr char kBuiltinTinyModel[] = "builtin:tiny";

// Defaults of hyperparameters left unset (0) in a JobSpec; `megatrain submit --help` shows them.
inline constexpr double kDefaultPeakLr = 3e-4;
inline constexpr uint32_t kDefaultBatchSize = 8;
inline constexpr uint64_t kDefaultSeqLen = 256;  // capped by max_seq_len and the model
// Defaults of the proto3 `optional` fields, used only when the field is absent: a field that
// is set is taken as given, 0 included.
inline constexpr double kDefaultValidationFraction = 0.05;
inline constexpr double kDefaultAdamBeta1 = 0.9;
inline constexpr double kDefaultAdamBeta2 = 0.95;
inline constexpr double kDefaultAdamEps = 1e-8;
inline constexpr uint32_t kDefaultEvalReplyTokens = 48;  // data.eval_reply_tokens

// One machine of a job with JobSpec.hosts: its name and how many ranks run there.
struct RankHost {
  std::string name;
  int ranks = 1;
};

struct ValidatedJob {
  engine::ModelConfig model;
  engine::TrainingRunOptions options;  // device filled from the daemon's settings
  int64_t parameters = 0;
  std::string output_dir;  // resolved; empty = none requested
  // JobSpec.reuse_output_dir: the job shares output_dir with a finished one, so its checkpoints
  // live in a directory of their own (JobCheckpointDir).
  bool reuse_output_dir = false;
  v1::PlanResponse plan;
  // The daemon's data roots (resolved) when the job was validated: the run-time recheck confines
  // the files of model.hf_directory to them (input_recheck.h).
  std::vector<std::string> data_roots;
  // data.chat_files (resolved) and data.chat_format ("auto" when unset): tokenized at run time
  // by the chat tokenizer process into options.sft_sample_paths (server/job_chat_samples.h).
  std::vector<std::string> chat_paths;
  std::string chat_format;
  // data.eval_prompts (user messages) and the longest reply in tokens: rendered at run time by
  // the chat tool (server/job_eval_prompts.h) into options.eval_prompts.
  std::vector<std::string> eval_prompts;
  int eval_reply_tokens = kDefaultEvalReplyTokens;
  // JobSpec.hosts, parsed (empty: the daemon's own process) and their ranks in all; the job's
  // grad_accumulation already counts every rank's micro-batches.
  std::vector<RankHost> hosts;
  int ranks = 1;
  // The spec as submitted: what the ranks of a job with hosts validate again on their machines.
  v1::JobSpec spec;
};

}  // namespace megatrain::service
