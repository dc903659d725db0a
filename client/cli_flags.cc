// The flags of the megatrain command line and their help text (`megatrain --help`); the
// commands read them through cli_flags.h.
#include "client/cli_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, socket, "/run/megatrain/megatraind.sock", "megatraind's Unix socket.");
ABSL_FLAG(std::string, address, "", "host:port of megatraind's TCP listener (TLS + token).");
ABSL_FLAG(std::string, token_file, "", "File holding the bearer token (with --address).");
ABSL_FLAG(std::string, ca_file, "", "PEM CA certificate of the daemon (with --address).");
ABSL_FLAG(bool, json, false, "Read commands print JSON instead of text.");
ABSL_FLAG(int, timeout_seconds, 0,
          "Deadline of the unary call in seconds; 0 = the command's own (30, checkpoint 150, "
          "resume 120).");
ABSL_FLAG(int, wait_seconds, 0, "Wait this long for the daemon to accept connections.");
ABSL_FLAG(std::string, spec, "", "submit/plan: JobSpec JSON file; flags below override it.");
ABSL_FLAG(std::string, name, "", "submit/plan: job name.");
ABSL_FLAG(std::string, model_config, "",
          "submit/plan: model config.json path on the daemon host, or builtin:tiny.");
ABSL_FLAG(std::string, text, "", "submit/plan: comma-separated text files on the daemon host.");
ABSL_FLAG(std::string, hf_directory, "",
          "submit/plan: model.hf_directory, a Hugging Face model directory on the daemon host.");
ABSL_FLAG(std::string, chat, "",
          "submit/plan: comma-separated chat / prompt-completion / Alpaca JSONL files on the "
          "daemon host (data.chat_files), tokenized with --hf_directory's tokenizer and chat "
          "template (docs/fine_tuning.md).");
ABSL_FLAG(std::string, chat_format, "",
          "submit/plan: data.chat_format: auto (default), chat, prompt_completion or alpaca.");
ABSL_FLAG(std::string, samples, "",
          "submit/plan: comma-separated pre-made MTSFT sample files (data.sample_files).");
ABSL_FLAG(bool, train_on_prompt, false,
          "submit/plan: fine-tuning: count the loss on prompt tokens too (unset: the spec's "
          "data.train_on_prompt, default false: the assistant tokens only).");
ABSL_FLAG(std::optional<bool>, pack, std::nullopt,
          "submit/plan: fine-tuning: pack several samples per row (default true).");
ABSL_FLAG(std::string, overlong, "",
          "submit/plan: fine-tuning: a sample longer than seq_len + 1 tokens is truncated "
          "(truncate, the default) or fails the job (refuse).");
ABSL_FLAG(uint64_t, steps, 0, "submit/plan: optimizer steps.");
ABSL_FLAG(uint32_t, batch_size, 0,
          "submit/plan: sequences per optimizer step; unset (0) = the daemon's default 8.");
ABSL_FLAG(uint32_t, micro_batch_size, 0, "submit/plan: sequences per forward/backward.");
ABSL_FLAG(uint32_t, seq_len, 0,
          "submit/plan: tokens per sequence; unset (0) = the daemon's default 256 (capped by "
          "its max_seq_len and the model's positions).");
ABSL_FLAG(double, lr, 0,
          "submit/plan: peak learning rate; unset (0) = the daemon's default 3e-4 (cosine decay "
          "to 0, no warmup, AdamW betas 0.9/0.95, eps 1e-8).");
ABSL_FLAG(std::optional<uint64_t>, warmup_steps, std::nullopt,
          "submit/plan: linear warmup steps (0 = none, overriding the spec).");
ABSL_FLAG(std::optional<uint32_t>, eval_every, std::nullopt,
          "submit/plan: validation every N steps (0 = only at the end, overriding the spec).");
ABSL_FLAG(std::string, output_dir, "", "submit/plan: output directory on the daemon host.");
ABSL_FLAG(std::optional<uint64_t>, seed, std::nullopt,
          "submit/plan: seed of weights and data order (0 is a seed like any other).");
ABSL_FLAG(double, older_than_days, 0, "purge: jobs that ended more than this many days ago.");
ABSL_FLAG(bool, reuse_output_dir, false,
          "submit: write into --output_dir although a finished job used it (refused otherwise); "
          "the job's checkpoints go to <output_dir>/checkpoints/<job id>.");
ABSL_FLAG(bool, watch, false, "submit: watch the job after submitting it.");
ABSL_FLAG(std::string, state, "", "list: comma-separated states to show (e.g. RUNNING,QUEUED).");
ABSL_FLAG(double, interval_seconds, 2, "top: seconds between screens.");
ABSL_FLAG(int, iterations, -1,
          "top: screens to draw; 0 = until interrupted; default: until interrupted on a "
          "terminal, once otherwise.");
ABSL_FLAG(bool, offline, false,
          "plan: run the engine planner in-process instead of asking a daemon (also the "
          "fallback when no daemon answers).");
ABSL_FLAG(bool, allow_data_change, false,
          "resume: continue although a data file changed since the job's lineage recorded it; "
          "the change is recorded (also spelled --allow-data-change).");
ABSL_FLAG(std::string, db, "",
          "audit: read and check the audit log in this state database file offline (no daemon), "
          "e.g. /var/lib/megatrain/megatrain.db.");
ABSL_FLAG(double, nvme_rated_tbw, 0,
          "plan: the NVMe drive's rated endurance in TB (1e12 bytes; summed over a striped "
          "array): warn when the run writes more than --nvme_wear_warn_share of it; 0 = the "
          "daemon's nvme_rated_tbw_bytes.");
ABSL_FLAG(double, nvme_wear_warn_share, 0,
          "plan: share of the rated TBW one run may write before the plan warns; 0 = 0.1.");
ABSL_FLAG(uint32_t, devices, 0,
          "submit/plan: devices the job trains on, data parallel (JobSpec.devices; 0 = the "
          "spec's, 1 = one). The daemon refuses more than it drives (one today).");
ABSL_FLAG(bool, speculative_update, false,
          "submit/plan: set JobSpec.speculative_update: the optimizer update runs during the "
          "last micro-batch's backward, kept when the step is not clipped (needs the spec's "
          "memory.master_on_nvme and NVMe room for a second master/m/v; docs/operations.md); "
          "unset: the spec's (default off).");
ABSL_FLAG(bool, scaling, false,
          "plan: in-process on the --hardware profile, predict tokens/s, TFLOP/s, scaling "
          "efficiency and bottleneck at 1, 2, 4, 8 devices, 2 and 4 nodes of 8, and --devices.");
ABSL_FLAG(std::string, hardware, "h100-sxm",
          "plan --scaling: the planner's hardware profile (h100-sxm, h100-pcie, h200, gh200, "
          "b200, a100-80gb, rtx4090, v100-32gb, h100-pcie-4nvme; docs/planning.md).");
ABSL_FLAG(std::string, daemon_config, "",
          "plan in-process: megatraind's config textproto whose device, budgets, roots and "
          "limits apply; empty = the defaults with / as the only root.");
