// train_local: trains a small Llama-family model on plain text on one device
// and prints progress; the engine's end-to-end demo (scripts/demo).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "engine/data/text_tokenizer.h"
#include "engine/device/cuda_device.h"
#include "engine/dist/mpi_communicator.h"
#include "engine/model/model_config.h"
#include "engine/provenance/signing_key.h"
#include "engine/tiers/nvme_tier_files.h"
#include "engine/train/rank_gpus.h"
#include "engine/train/training_run.h"
#include "kernels/cpu/blas_kernels.h"

ABSL_FLAG(std::string, text, "/usr/share/games/fortunes",
          "Comma-separated text files (fortune-format, plain or *.jsonl with one "
          "{\"text\": ...} per line) or directories to train on.");
ABSL_FLAG(std::string, tokenizer, "bytes",
          "How --text is tokenized: bytes, or the path of a SentencePiece .model (without "
          "--config, the built-in model's vocabulary becomes the tokenizer's).");
ABSL_FLAG(std::string, data_files, "",
          "Comma-separated pre-tokenized token files to train on instead of --text.");
ABSL_FLAG(std::string, token_format, "u16",
          "Format of --data_files: u16 / u32 (raw little-endian) or llmc (llm.c header).");
ABSL_FLAG(std::string, sft_samples, "",
          "Comma-separated SFT sample-set files (MTSFT, docs/data.md): supervised fine-tuning "
          "with loss masks instead of --text / --data_files.");
ABSL_FLAG(bool, pack, true,
          "SFT: pack several whole samples per sequence (attention never crosses samples); "
          "false = one padded sample per sequence.");
ABSL_FLAG(bool, train_on_prompt, false,
          "SFT: count every token of a sample but its first, not only assistant tokens.");
ABSL_FLAG(std::string, overlong, "truncate",
          "SFT: a sample longer than seq_len + 1 tokens: truncate (counted) or refuse.");
ABSL_FLAG(std::string, config, "",
          "Hugging Face config.json of the model; empty = the built-in ~10M model.");
ABSL_FLAG(std::string, init_from, "",
          "Hugging Face model directory (config.json + *.safetensors) to start from; its config "
          "is used unless --config is given. Pickle .bin weights are refused.");
ABSL_FLAG(std::string, checkpoint_dtype, "",
          "dtype of checkpointed model files: F32, BF16 or F16; empty = the source's "
          "(F32 from scratch).");
ABSL_FLAG(int, steps, 300, "Optimizer steps.");
ABSL_FLAG(int, micro_batch, 8, "Sequences per forward/backward.");
ABSL_FLAG(int, accumulation, 1, "Micro-batches per optimizer step.");
ABSL_FLAG(int, devices, 1,
          "Devices of this process to train on (docs/scale_out.md): the CPU device that many "
          "times, or CUDA ordinals 0..N-1; micro-batch m of a step runs on device m % N, so "
          "--accumulation must be a multiple. Results equal one device's bit for bit.");
ABSL_FLAG(int, seq_len, 128, "Tokens per sequence.");
ABSL_FLAG(double, lr, 2e-3, "Peak learning rate.");
ABSL_FLAG(int, warmup, 30, "Linear warmup steps.");
ABSL_FLAG(double, weight_decay, 0.1, "AdamW weight decay of 2-D weights.");
ABSL_FLAG(double, clip, 1.0, "Global gradient-norm clip; 0 = off.");
ABSL_FLAG(std::string, clip_rule, "exact",
          "How the clip coefficient is chosen: exact (the step's own norm) or previous_norm "
          "(after a clipped step, planned from --clip_headroom x its norm and applied to the next "
          "when that one clips too and the applied gradient stays within the clip; with "
          "--speculative_update clipped steps commit too; docs/operations.md \"Clip rules\").");
ABSL_FLAG(double, clip_headroom, megatrain::engine::kDefaultGradClipHeadroom,
          "--clip_rule=previous_norm: the plan's headroom over the previous norm (>= 1).");
ABSL_FLAG(int, eval_every, 50, "Evaluate the validation loss every N steps.");
ABSL_FLAG(int, checkpoint_every_layers, 4, "Activation checkpoint interval k.");
ABSL_FLAG(bool, keep_all, false, "Keep every activation (no recomputation).");
ABSL_FLAG(int, weight_slots, 0, "Device weight slots; 0 = as many as the arena holds.");
ABSL_FLAG(std::string, gradient_accumulation, "auto",
          "Where a step's gradients are summed over its micro-batches: host (each micro-batch's "
          "gradients copied out and added on the host), device (fp32 sums kept on the device, "
          "copied out once a step), or auto (device on a GPU when the sums fit the arena and "
          "--accumulation > 1). Results are the same bits either way.");
ABSL_FLAG(std::string, gradient_reduction, "auto",
          "With --devices > 1, where the devices' gradients meet: host (each device's "
          "contributions added into the host's arrays in micro-batch order; bitwise one "
          "device's accumulation), devices (each device sums its micro-batches, a reduce-scatter "
          "among the devices adds the sums, each copies out 1/N: NCCL on GPUs, rank order on "
          "the CPU device), device_shards (every micro-batch's gradients reduce-scattered, each "
          "device keeping only its 1/N of the sums: for models whose whole sums do not fit), or "
          "auto (devices, else device_shards, on GPUs where they fit). With one device per "
          "rank of a data-parallel job, devices and device_shards reduce-scatter among the "
          "ranks instead (the CPU device; auto keeps the host's reduction there).");
ABSL_FLAG(std::string, device, "cpu", "cpu (the emulated GPU) or cuda (a GPU: --cuda_device).");
ABSL_FLAG(int, cuda_device, -1,
          "The first CUDA ordinal this process drives (--devices consecutive ones); -1 = 0, or "
          "under mpirun the rank's share of its machine's GPUs (local rank x --devices), or 0 "
          "where the launcher gave each rank exactly its own (CUDA_VISIBLE_DEVICES).");
ABSL_FLAG(int, arena_mb, 512, "Device memory for the executor's arena, in MiB.");
ABSL_FLAG(double, link_gbps, 0,
          "CPU device only: emulated host<->device link in GB/s; 0 = unthrottled.");
ABSL_FLAG(double, link_latency_us, 0, "Emulated link latency in microseconds.");
ABSL_FLAG(int, threads, 2, "BLAS threads (the CPU device's compute; results depend on it).");
ABSL_FLAG(int, optimizer_threads, 0,
          "Host AdamW threads; 0 = one per core this process may run on (results do not depend "
          "on it).");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the initial weights and the data order.");
ABSL_FLAG(std::string, trace, "", "Write a Chrome trace (JSON) of the last step here.");
ABSL_FLAG(bool, serial, false, "Disable transfer/compute overlap (baseline).");
ABSL_FLAG(int64_t, pinned_ram_mb, 0,
          "Host memory budgets (MiB) for the memory tiers; all 0 = everything in RAM. "
          "Pinned RAM for the copy endpoints (master, gradients).");
ABSL_FLAG(int64_t, ram_mb, 0, "Pageable RAM budget (MiB).");
ABSL_FLAG(std::string, nvme_dir, "",
          "Directory on a block-backed filesystem (O_DIRECT) for the NVMe tier (data-parallel "
          "rank R uses its subdirectory rank-R).");
ABSL_FLAG(int64_t, nvme_mb, 0, "Bytes the NVMe tier may use (MiB).");
ABSL_FLAG(bool, states_on_nvme, false, "Put AdamW m and v on the NVMe tier even if RAM fits.");
ABSL_FLAG(bool, grad_on_nvme, false,
          "Put the fp32 gradients (all but the embedding's) on the NVMe tier too, even if RAM "
          "fits them (needs --nvme_dir; the placement moves them anyway when RAM overflows).");
ABSL_FLAG(bool, compute_copy_on_nvme, false,
          "Put the compute copy on the NVMe tier too, with the master (all but the embedding's): "
          "weights stream from NVMe in step order.");
ABSL_FLAG(int64_t, nvme_chunk_mb, 64,
          "MiB per array of the chunks NVMe traffic and the host optimizer work in (results "
          "never depend on it); with --zero1 also the unit of the ranks' shards, with or without "
          "the NVMe tier (every rank must give the same).");
ABSL_FLAG(int64_t, weight_ring_mb, 0,
          "Fragmented weight streaming through a device ring of this many MiB (it must hold the "
          "largest tensor); 0 = whole-layer weight slots.");
ABSL_FLAG(bool, cuda_blocking_sync, true,
          "CUDA: host threads waiting for the GPU sleep instead of spinning a core "
          "(cudaDeviceScheduleBlockingSync); false = the driver's default.");
ABSL_FLAG(bool, cuda_host_task_threads, true,
          "CUDA: run each stream's host tasks on a thread of its own (the stream waits on a word "
          "it writes) instead of on the driver's one callback thread; false = the callback "
          "thread (a first-run diagnosis switch).");
ABSL_FLAG(int, head_block_rows, 0,
          "LM-head vocabulary rows per block (the head's device scratch and ring units are one "
          "block); 0 = 8192.");
ABSL_FLAG(bool, master_on_nvme, false,
          "Put the fp32 master on the NVMe tier too, streamed with m and v (needs --nvme_dir; on "
          "the CPU device adds a pinned fp32 compute copy, so it saves no RAM there).");
ABSL_FLAG(bool, speculative_update, false,
          "Update each entry during the last micro-batch's backward with clip coefficient 1 into "
          "a second copy of its master, m and v, kept when the step's clip coefficient is "
          "exactly 1 (bitwise the normal update), else redone; needs the master, m and v all on "
          "NVMe (alternate regions, room for a second copy), all in RAM (alternate arrays, 12 "
          "bytes per parameter more), or the master in RAM with m and v on NVMe (a master "
          "array, 4 bytes per parameter of RAM, and m/v regions); else off, said in the "
          "placement table.");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "Directory for checkpoints (step-N subdirectories); empty = no checkpoints.");
ABSL_FLAG(int, checkpoint_every, 0,
          "Write a checkpoint every N steps (and after the last); 0 = only after the last.");
ABSL_FLAG(int, keep_last, 0, "Checkpoints to keep; 0 = all.");
ABSL_FLAG(std::string, signing_key, "",
          "Ed25519 key (PEM, created with mode 0600 if missing) that signs every checkpoint's "
          "provenance record; empty = unsigned records.");
ABSL_FLAG(bool, data_parallel, false,
          "Train as one rank of a data-parallel job launched by mpirun (docs/scale_out.md): "
          "each rank runs --accumulation / ranks micro-batches of every step; gradients are "
          "reduced in rank order; rank 0 prints and writes checkpoints. Implied when mpirun "
          "launched this process.");
ABSL_FLAG(bool, zero1, false,
          "With --data_parallel: shard the AdamW state across the ranks (ZeRO-1, "
          "docs/scale_out.md): each rank keeps m and v of its own layers only; every rank writes "
          "its shard of each checkpoint at the same step. Results equal the replicated run's.");
ABSL_FLAG(int, collective_timeout_s, 300,
          "With --data_parallel: seconds a rank waits in one collective for the others before it "
          "ends the whole job naming itself, its host, the collective and the step (a rank that "
          "is stopped or hung); 0 = wait forever. Must exceed the longest gap between ranks "
          "(rank 0 writing a checkpoint's model while the others wait). Also each NCCL "
          "reduce-scatter among GPUs, from when its stream reaches it.");
ABSL_FLAG(bool, resume, false,
          "Continue from the newest checkpoint in --checkpoint_dir when one exists.");


int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Trains a small model on text on the CPU device (or a GPU with --device=cuda).\n"
      "Example: train_local --text=/usr/share/games/fortunes --steps=300");
  absl::ParseCommandLine(argc, argv);
  using namespace megatrain::engine;
  if (absl::GetFlag(FLAGS_device) == "cpu") {
    if (const std::string blas = megatrain::kernels::cpu::SlowBlasKernelsWarning(); !blas.empty()) {
      fprintf(stderr, "warning: %s\n", blas.c_str());
    }
  }

  ModelConfig config = TinyTextModelConfig();
  std::string config_path = absl::GetFlag(FLAGS_config);
  if (config_path.empty() && !absl::GetFlag(FLAGS_init_from).empty()) {
    config_path = absl::GetFlag(FLAGS_init_from) + "/config.json";
  }
  if (!config_path.empty()) {
    absl::StatusOr<ModelConfig> loaded = LoadModelConfig(config_path);
    if (!loaded.ok()) {
      fprintf(stderr, "error: %s\n", std::string(loaded.status().message()).c_str());
      return 2;
    }
    config = *loaded;
  } else if (absl::GetFlag(FLAGS_data_files).empty() && absl::GetFlag(FLAGS_tokenizer) != "bytes") {
    absl::StatusOr<std::unique_ptr<TextTokenizer>> tokenizer =
        CreateTextTokenizer(absl::GetFlag(FLAGS_tokenizer));
    if (!tokenizer.ok()) {
      fprintf(stderr, "error: %s\n", std::string(tokenizer.status().message()).c_str());
      return 2;
    }
    config.vocab_size = (*tokenizer)->vocab_size();
  }
  TrainingRunOptions o;
  o.init_from_hf_dir = absl::GetFlag(FLAGS_init_from);
  o.checkpoint_dtype = absl::GetFlag(FLAGS_checkpoint_dtype);
  for (absl::string_view p : absl::StrSplit(absl::GetFlag(FLAGS_text), ',', absl::SkipEmpty())) {
    o.text_paths.emplace_back(p);
  }
  for (absl::string_view p :
       absl::StrSplit(absl::GetFlag(FLAGS_data_files), ',', absl::SkipEmpty())) {
    o.token_files.emplace_back(p);
  }
  o.token_format = absl::GetFlag(FLAGS_token_format);
  for (absl::string_view p :
       absl::StrSplit(absl::GetFlag(FLAGS_sft_samples), ',', absl::SkipEmpty())) {
    o.sft_sample_paths.emplace_back(p);
  }
  o.pack = absl::GetFlag(FLAGS_pack);
  o.train_on_prompt = absl::GetFlag(FLAGS_train_on_prompt);
  o.overlong = absl::GetFlag(FLAGS_overlong);
  o.tokenizer = absl::GetFlag(FLAGS_tokenizer);
  o.steps = static_cast<uint64_t>(std::max(1, absl::GetFlag(FLAGS_steps)));
  o.grad_accumulation = absl::GetFlag(FLAGS_accumulation);
  o.devices = absl::GetFlag(FLAGS_devices);
  if (o.devices < 1 || o.grad_accumulation % o.devices != 0) {
    fprintf(stderr, "error: --accumulation=%d must be a multiple of --devices=%d (>= 1)\n",
            o.grad_accumulation, o.devices);
    return 1;
  }
  o.eval_every = absl::GetFlag(FLAGS_eval_every);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.chrome_trace_path = absl::GetFlag(FLAGS_trace);
  o.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  o.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  o.keep_last = absl::GetFlag(FLAGS_keep_last);
  o.resume = absl::GetFlag(FLAGS_resume);
  if (const std::string key_path = absl::GetFlag(FLAGS_signing_key); !key_path.empty()) {
    absl::StatusOr<megatrain::provenance::SigningKey> key =
        megatrain::provenance::SigningKey::LoadOrCreate(key_path);
    if (!key.ok()) {
      fprintf(stderr, "error: %s\n", std::string(key.status().message()).c_str());
      return 2;
    }
    o.signer = std::make_shared<const megatrain::provenance::SigningKey>(*std::move(key));
  }
  if (o.resume && o.checkpoint_dir.empty()) {
    fprintf(stderr, "error: --resume needs --checkpoint_dir\n");
    return 2;
  }
  TrainerOptions& t = o.trainer;
  t.micro_batch_size = absl::GetFlag(FLAGS_micro_batch);
  t.seq_len = absl::GetFlag(FLAGS_seq_len);
  t.lr.peak_lr = absl::GetFlag(FLAGS_lr);
  t.lr.warmup_steps = static_cast<uint64_t>(std::max(0, absl::GetFlag(FLAGS_warmup)));
  t.lr.total_steps = o.steps;
  t.lr.cosine = true;
  t.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  t.grad_clip = absl::GetFlag(FLAGS_clip);
  {
    absl::StatusOr<GradClipRule> rule = ParseGradClipRule(absl::GetFlag(FLAGS_clip_rule));
    if (!rule.ok()) {
      fprintf(stderr, "error: --clip_rule: %s\n", std::string(rule.status().message()).c_str());
      return 2;
    }
    t.grad_clip_rule = *rule;
  }
  t.grad_clip_headroom = absl::GetFlag(FLAGS_clip_headroom);
  if (t.grad_clip_rule != GradClipRule::kPreviousNorm &&
      t.grad_clip_headroom != kDefaultGradClipHeadroom) {
    fprintf(stderr, "error: --clip_headroom=%g applies to --clip_rule=previous_norm only\n",
            t.grad_clip_headroom);
    return 2;
  }
  t.executor.checkpoint_interval = absl::GetFlag(FLAGS_checkpoint_every_layers);
  t.executor.keep_all = absl::GetFlag(FLAGS_keep_all);
  t.executor.weight_slots = absl::GetFlag(FLAGS_weight_slots);
  t.executor.serial = absl::GetFlag(FLAGS_serial);
  {
    absl::StatusOr<GradientAccumulation> accumulation =
        ParseGradientAccumulation(absl::GetFlag(FLAGS_gradient_accumulation));
    if (!accumulation.ok()) {
      fprintf(stderr, "error: --%s\n", std::string(accumulation.status().message()).c_str());
      return 2;
    }
    t.executor.gradient_accumulation = *accumulation;
  }
  {
    absl::StatusOr<GradientReduction> reduction =
        ParseGradientReduction(absl::GetFlag(FLAGS_gradient_reduction));
    if (!reduction.ok()) {
      fprintf(stderr, "error: --%s\n", std::string(reduction.status().message()).c_str());
      return 2;
    }
    t.gradient_reduction = *reduction;
  }
  t.blas_threads = absl::GetFlag(FLAGS_threads);
  t.optimizer_threads = absl::GetFlag(FLAGS_optimizer_threads);
  t.collect_timeline = !o.chrome_trace_path.empty();
  t.speculative_update = absl::GetFlag(FLAGS_speculative_update);
  const int64_t chunk_mb = absl::GetFlag(FLAGS_nvme_chunk_mb);
  if (chunk_mb < 1 || chunk_mb > (int64_t{1} << 20)) {
    fprintf(stderr, "error: --nvme_chunk_mb=%lld must be 1..1048576\n",
            static_cast<long long>(chunk_mb));
    return 2;
  }
  t.memory.nvme_chunk_bytes = static_cast<size_t>(chunk_mb) << 20;
  const int64_t pinned_mb = absl::GetFlag(FLAGS_pinned_ram_mb);
  const int64_t ram_mb = absl::GetFlag(FLAGS_ram_mb);
  if (pinned_mb > 0 || ram_mb > 0 || !absl::GetFlag(FLAGS_nvme_dir).empty()) {
    if (pinned_mb < 0 || ram_mb < 0 || absl::GetFlag(FLAGS_nvme_mb) < 0) {
      fprintf(stderr, "error: --pinned_ram_mb, --ram_mb and --nvme_mb must be >= 0\n");
      return 2;
    }
    t.memory.enabled = true;
    t.memory.budgets.pinned_ram = static_cast<uint64_t>(pinned_mb) << 20;
    t.memory.budgets.ram = static_cast<uint64_t>(ram_mb) << 20;
    t.memory.budgets.nvme_dir = absl::GetFlag(FLAGS_nvme_dir);
    t.memory.budgets.nvme_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_nvme_mb)) << 20;
    t.memory.states_on_nvme = absl::GetFlag(FLAGS_states_on_nvme);
    t.memory.master_on_nvme = absl::GetFlag(FLAGS_master_on_nvme);
    t.memory.grad_on_nvme = absl::GetFlag(FLAGS_grad_on_nvme);
    t.memory.compute_copy_on_nvme = absl::GetFlag(FLAGS_compute_copy_on_nvme);
  } else if (absl::GetFlag(FLAGS_master_on_nvme) || absl::GetFlag(FLAGS_grad_on_nvme) ||
             absl::GetFlag(FLAGS_compute_copy_on_nvme)) {
    fprintf(stderr,
            "error: --master_on_nvme, --grad_on_nvme and --compute_copy_on_nvme need "
            "--nvme_dir\n");
    return 2;
  }
  if (absl::GetFlag(FLAGS_weight_ring_mb) < 0) {
    fprintf(stderr, "error: --weight_ring_mb must be >= 0\n");
    return 2;
  }
  t.executor.weight_ring_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_weight_ring_mb)) << 20;
  if (absl::GetFlag(FLAGS_head_block_rows) < 0) {
    fprintf(stderr, "error: --head_block_rows must be >= 0\n");
    return 2;
  }
  t.head_block_rows = absl::GetFlag(FLAGS_head_block_rows);
  absl::StatusOr<DeviceKind> kind = ParseDeviceKind(absl::GetFlag(FLAGS_device));
  if (!kind.ok()) {
    std::fprintf(stderr, "train_local: --device: %s\n",
                 std::string(kind.status().message()).c_str());
    return 2;
  }
  o.device.kind = *kind;
  o.device.cuda_host_task_threads = absl::GetFlag(FLAGS_cuda_host_task_threads);
  o.device.cuda_blocking_sync = absl::GetFlag(FLAGS_cuda_blocking_sync);
  o.device.arena_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_arena_mb)) << 20;
  o.device.pinned_budget_bytes = size_t{64} << 30;
  o.device.link_gbps = absl::GetFlag(FLAGS_link_gbps);
  o.device.link_latency_us = absl::GetFlag(FLAGS_link_latency_us);

  std::unique_ptr<megatrain::engine::dist::MpiCommunicator> mpi;
  const bool data_parallel =
      absl::GetFlag(FLAGS_data_parallel) || megatrain::engine::dist::LaunchedByMpi();
  if (absl::GetFlag(FLAGS_zero1) && !data_parallel) {
    fprintf(stderr, "error: --zero1 needs --data_parallel (ranks launched by mpirun)\n");
    return 2;
  }
  if (absl::GetFlag(FLAGS_collective_timeout_s) < 0) {
    fprintf(stderr, "error: --collective_timeout_s=%d must be >= 0 (0 = no deadline)\n",
            absl::GetFlag(FLAGS_collective_timeout_s));
    return 2;
  }
  t.zero1 = absl::GetFlag(FLAGS_zero1);
  // The same deadline for the devices' collectives (NCCL's reduce-scatter among GPUs).
  t.collective_timeout = absl::GetFlag(FLAGS_collective_timeout_s) == 0
                             ? absl::InfiniteDuration()
                             : absl::Seconds(absl::GetFlag(FLAGS_collective_timeout_s));
  if (data_parallel) {
    megatrain::engine::dist::MpiCommunicatorOptions mpi_options;
    mpi_options.collective_timeout =
        std::chrono::seconds(absl::GetFlag(FLAGS_collective_timeout_s));
    absl::StatusOr<std::unique_ptr<megatrain::engine::dist::MpiCommunicator>> c =
        megatrain::engine::dist::MpiCommunicator::Create(mpi_options);
    if (!c.ok()) {
      fprintf(stderr, "error: --data_parallel: %s\n", std::string(c.status().message()).c_str());
      return 2;
    }
    mpi = *std::move(c);
    t.communicator = mpi.get();
    if (!t.memory.budgets.nvme_dir.empty()) {
      // The NVMe tier's files have fixed names: ranks sharing a machine (and a --nvme_dir) each
      // get a directory of their own.
      t.memory.budgets.nvme_dir =
          megatrain::engine::tiers::RankTierDirectory(t.memory.budgets.nvme_dir, mpi->rank());
      std::error_code ec;
      std::filesystem::create_directories(t.memory.budgets.nvme_dir, ec);
      if (ec) {
        fprintf(stderr, "error: rank %d of %d on host %s: --nvme_dir: cannot create %s: %s\n",
                mpi->rank(), mpi->size(), mpi->host().c_str(), t.memory.budgets.nvme_dir.c_str(),
                ec.message().c_str());
        fflush(stderr);
        mpi->Abort(2);
      }
    }
  }
  if (absl::GetFlag(FLAGS_cuda_device) >= 0) {
    o.device.cuda_device_ordinal = absl::GetFlag(FLAGS_cuda_device);
  }
  if (mpi != nullptr && o.device.kind == megatrain::engine::DeviceKind::kCuda) {
    if (absl::Status s = megatrain::engine::ChooseRankGpus(*mpi, absl::GetFlag(FLAGS_cuda_device) < 0, o.devices,
                                        o.device.cuda_device_ordinal);
        !s.ok()) {
      fprintf(stderr, "error: rank %d of %d on host %s: --device=cuda: %s\n", mpi->rank(),
              mpi->size(), mpi->host().c_str(), std::string(s.message()).c_str());
      fflush(stderr);
      mpi->Abort(2);
    }
  }
  const bool quiet = mpi != nullptr && mpi->rank() != 0;  // rank 0 speaks for the job
  const bool tty = isatty(fileno(stderr));
  auto progress = [tty, quiet](const std::string& line, bool keep) {
    if (quiet) return;
    if (tty) {
      fprintf(stderr, "\r\033[K%s%s", line.c_str(), keep ? "\n" : "");
    } else {
      fprintf(stderr, "%s\n", line.c_str());
    }
    fflush(stderr);
  };
  absl::StatusOr<TrainingRunResult> result = RunTraining(config, o, progress);
  if (!result.ok()) {
    if (mpi != nullptr) {
      // The other ranks may be waiting in a collective for this one: end the whole job.
      fprintf(stderr, "\nerror: rank %d of %d on host %s: %s\n", mpi->rank(), mpi->size(),
              mpi->host().c_str(), result.status().ToString().c_str());
      fflush(stderr);
      mpi->Abort(1);
    }
    fprintf(stderr, "\nerror: %s\n", result.status().ToString().c_str());
    return 1;
  }
  if (quiet) return 0;
  // The unigram entropy is the bar to beat for text only (it is not computed for token files,
  // and a sample set's loss counts only its masked targets).
  const std::string entropy =
      RunDataIsText(o) ? absl::StrFormat(" (unigram entropy %.4f)", result->unigram_entropy_nats)
                       : "";
  printf("trained %ld parameters for %lu steps: validation loss %.4f -> %.4f nats/token%s, "
         "median %.0f tokens/s\n",
         static_cast<long>(result->parameters), static_cast<unsigned long>(o.steps),
         result->initial_validation_loss, result->final_validation_loss, entropy.c_str(),
         result->tokens_per_second);
  return 0;
}
