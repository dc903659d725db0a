// Job spec validation (see job_spec_validation.h).
#include "service/job_spec_validation.h"

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/data/token_file.h"
#include "engine/model/hf_loader.h"
#include "engine/model/parameter_layout.h"
#include "engine/planner/planner.h"
#include "engine/tiers/direct_io_directory.h"
#include "engine/tiers/placement.h"
#include "service/hf_directory_files.h"

namespace megatrain::service {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", problem));
}

absl::Status CheckFiniteRange(absl::string_view field, double value, double lo, double hi,
                              bool lo_open) {
  if (!std::isfinite(value)) return Invalid(field, absl::StrCat(value, " is not finite"));
  if ((lo_open ? value <= lo : value < lo) || value > hi) {
    return Invalid(field,
                   absl::StrCat(value, " is outside ", lo_open ? "(" : "[", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckRange(absl::string_view field, uint64_t value, uint64_t lo, uint64_t hi) {
  if (value < lo || value > hi) {
    return Invalid(field, absl::StrCat(value, " is outside [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

// Bytes a text path will load: a file's size, or a directory's regular files (one level).
uint64_t InputBytes(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    uint64_t total = 0;
    for (const auto& entry : std::filesystem::directory_iterator(path, ec)) {
      if (entry.is_regular_file(ec)) total += entry.file_size(ec);
    }
    return total;
  }
  const uint64_t size = std::filesystem::file_size(path, ec);
  return ec ? 0 : size;
}

constexpr uint64_t kMaxTextBytes = uint64_t{2} << 30;
constexpr int kMaxTextFiles = 1024;
constexpr uint32_t kMaxBatch = 4096;

absl::Status ValidateModel(const v1::ModelSource& model, const DaemonSettings& settings,
                           const PathPolicy& paths, ValidatedJob& job) {
  switch (model.source_case()) {
    case v1::ModelSource::SOURCE_NOT_SET:
      return Invalid("model", "set model.config_json_path (or \"builtin:tiny\")");
    case v1::ModelSource::kHfDirectory: {
      absl::StatusOr<std::string> dir =
          paths.ResolveInput("model.hf_directory", model.hf_directory());
      if (!dir.ok()) return dir.status();
      if (absl::Status s = CheckHfDirectoryFiles(*dir, paths); !s.ok()) return s;
      absl::StatusOr<engine::ModelConfig> config = engine::LoadModelConfig(*dir + "/config.json");
      if (!config.ok()) return Invalid("model.hf_directory", config.status().message());
      // Finds the weight files (refusing pickle-only directories) and reads
      // their headers only; the weights load when the job runs.
      absl::StatusOr<engine::SafetensorsDtype> dtype = engine::HfWeightsDtype(*dir);
      if (!dtype.ok()) return Invalid("model.hf_directory", dtype.status().message());
      job.model = *config;
      job.options.init_from_hf_dir = *dir;
      break;
    }
    case v1::ModelSource::kConfigJsonPath:
      break;
  }
  if (model.source_case() == v1::ModelSource::kHfDirectory) {
    // job.model was read from the directory above.
  } else if (model.config_json_path() == kBuiltinTinyModel) {
    job.model = engine::TinyTextModelConfig();
  } else {
    absl::StatusOr<std::string> path =
        paths.ResolveInput("model.config_json_path", model.config_json_path());
    if (!path.ok()) return path.status();
    std::error_code ec;
    if (std::filesystem::is_directory(*path, ec)) {
      return Invalid("model.config_json_path", absl::StrCat("'", *path, "' is a directory"));
    }
    if (std::filesystem::file_size(*path, ec) > (1u << 20)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("model.config_json_path: '", *path, "' is larger than 1 MiB"));
    }
    absl::StatusOr<engine::ModelConfig> config = engine::LoadModelConfig(*path);
    if (!config.ok()) return Invalid("model.config_json_path", config.status().message());
    job.model = *config;
  }
  const char* model_field = model.source_case() == v1::ModelSource::kHfDirectory
                                ? "model.hf_directory"
                                : "model.config_json_path";
  absl::StatusOr<engine::ParameterLayout> layout = engine::ParameterLayout::Create(job.model);
  if (!layout.ok()) return Invalid(model_field, layout.status().message());
  job.parameters = layout->parameter_count();
  if (static_cast<uint64_t>(job.parameters) > settings.max_parameters) {
    return absl::ResourceExhaustedError(absl::StrCat("model: ", job.parameters,
                                                     " parameters exceed the daemon's limit of ",
                                                     settings.max_parameters));
  }
  return absl::OkStatus();
}

// Pre-tokenized data: each file opened (size, llm.c header) and its ids checked against the
// model's vocabulary (one pass over the mapped tokens, as the engine does before training).
absl::Status ValidateTokenFiles(const v1::DataSource& data, const PathPolicy& paths,
                                ValidatedJob& job) {
  if (data.text_files_size() > 0) {
    return Invalid("data.token_files", "set either token_files or text_files, not both");
  }
  if (!data.tokenizer().empty()) {
    return Invalid("data.tokenizer", "token files are already tokenized; leave it empty");
  }
  if (data.token_files_size() > kMaxTextFiles) {
    return Invalid("data.token_files",
                   absl::StrCat(data.token_files_size(), " entries exceed ", kMaxTextFiles));
  }
  const std::string format_name = data.token_format().empty() ? "u16" : data.token_format();
  absl::StatusOr<engine::TokenFileFormat> format = engine::ParseTokenFileFormat(format_name);
  if (!format.ok()) {
    return Invalid("data.token_format",
                   absl::StrCat("'", format_name.substr(0, 64), "' is not u16, u32 or llmc"));
  }
  for (int i = 0; i < data.token_files_size(); ++i) {
    const std::string field = absl::StrCat("data.token_files[", i, "]");
    absl::StatusOr<std::string> path = paths.ResolveInput(field, data.token_files(i));
    if (!path.ok()) return path.status();
    std::error_code ec;
    if (std::filesystem::is_directory(*path, ec)) {
      return Invalid(field, absl::StrCat("'", *path, "' is a directory; name the files"));
    }
    job.options.token_files.push_back(*path);
  }
  absl::StatusOr<engine::TokenFiles> files =
      engine::TokenFiles::Open(job.options.token_files, *format);
  if (!files.ok()) return Invalid("data.token_files", files.status().message());
  absl::StatusOr<int32_t> max_token = files->MaxToken();
  if (!max_token.ok()) return Invalid("data.token_files", max_token.status().message());
  if (*max_token >= job.model.vocab_size) {
    return Invalid("data.token_files",
                   absl::StrCat("hold token id ", *max_token, ", outside the model's vocab_size ",
                                job.model.vocab_size));
  }
  job.options.token_format = format_name;
  return absl::OkStatus();
}

absl::Status ValidateTextFiles(const v1::DataSource& data, const PathPolicy& paths,
                               ValidatedJob& job) {
  if (data.text_files_size() == 0) {
    return Invalid("data.text_files", "at least one file (or data.token_files) is required");
  }
  if (data.text_files_size() > kMaxTextFiles) {
    return Invalid("data.text_files",
                   absl::StrCat(data.text_files_size(), " entries exceed ", kMaxTextFiles));
  }
  if (!data.token_format().empty()) {
    return Invalid("data.token_format", "applies to data.token_files only");
  }
  uint64_t total = 0;
  for (int i = 0; i < data.text_files_size(); ++i) {
    const std::string field = absl::StrCat("data.text_files[", i, "]");
    absl::StatusOr<std::string> path = paths.ResolveInput(field, data.text_files(i));
    if (!path.ok()) return path.status();
    total += InputBytes(*path);
    job.options.text_paths.push_back(*path);
  }
  if (total > kMaxTextBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("data.text_files: ", total, " bytes exceed the 2 GiB a job may load"));
  }
  if (data.tokenizer().empty() && !job.options.init_from_hf_dir.empty()) {
    // A pretrained model knows its own token ids, not bytes: byte-tokenizing its text would
    // train it on ids 0-255 without a word of warning (issue 21, point 9).
    return Invalid("data.tokenizer",
                   "model.hf_directory with data.text_files needs the model's tokenizer: give "
                   "data.tokenizer (its SentencePiece .model), or \"bytes\" to train on bytes "
                   "on purpose, or tokenize first and give data.token_files");
  }
  if (data.tokenizer().empty() || data.tokenizer() == "bytes") {
    job.options.tokenizer = "bytes";
    if (job.model.vocab_size < 256) {
      return Invalid("model", absl::StrCat("vocab_size ", job.model.vocab_size,
                                           " is smaller than the byte tokenizer's 256"));
    }
    return absl::OkStatus();
  }
  // A SentencePiece model: only its path is checked here. It is never loaded inside megatraind
  // (libsentencepiece's bundled protobuf clashes with the daemon's); the job's first run
  // tokenizes the text with it in a megatrain_tokenize process (server/job_tokens.h), which also
  // checks its vocabulary against the model's.
  absl::StatusOr<std::string> tokenizer = paths.ResolveInput("data.tokenizer", data.tokenizer());
  if (!tokenizer.ok()) return tokenizer.status();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(*tokenizer, ec)) {
    return Invalid("data.tokenizer",
                   absl::StrCat("'", *tokenizer, "' is not a file (a SentencePiece .model)"));
  }
  job.options.tokenizer = *tokenizer;
  return absl::OkStatus();
}

absl::Status ValidateData(const v1::DataSource& data, const PathPolicy& paths, ValidatedJob& job) {
  absl::Status source = data.token_files_size() > 0 ? ValidateTokenFiles(data, paths, job)
                                                    : ValidateTextFiles(data, paths, job);
  if (!source.ok()) return source;
  const double fraction =
      data.has_validation_fraction() ? data.validation_fraction() : kDefaultValidationFraction;
  if (absl::Status s = CheckFiniteRange("data.validation_fraction", fraction, 0, 0.5, false);
      !s.ok()) {
    return s;
  }
  job.options.validation_fraction = fraction;
  if (absl::Status s = CheckRange("data.eval_windows", data.eval_windows(), 0, 4096); !s.ok()) {
    return s;
  }
  job.options.eval_every = static_cast<int>(std::min<uint32_t>(data.eval_every_steps(), 1 << 30));
  return absl::OkStatus();
}

absl::Status ValidateHyper(const v1::Hyperparameters& given, const v1::DataSource& data,
                           const DaemonSettings& settings, ValidatedJob& job) {
  // Unset (0) fields take the documented defaults (docs/daemon.md), so a minimal submit works.
  v1::Hyperparameters h = given;
  if (h.batch_size() == 0) h.set_batch_size(kDefaultBatchSize);
  if (h.seq_len() == 0) {
    h.set_seq_len(static_cast<uint32_t>(std::min<uint64_t>(
        {kDefaultSeqLen, settings.max_seq_len,
         static_cast<uint64_t>(std::max<int64_t>(1, job.model.max_position_embeddings))})));
  }
  if (h.lr().peak_lr() == 0) h.mutable_lr()->set_peak_lr(kDefaultPeakLr);
  if (absl::Status s = CheckRange("hyper.steps", h.steps(), 1, settings.max_steps); !s.ok()) {
    return s;
  }
  job.options.steps = h.steps();
  if (absl::Status s = CheckRange("hyper.batch_size", h.batch_size(), 1, kMaxBatch); !s.ok()) {
    return s;
  }
  const uint32_t micro = h.micro_batch_size() == 0 ? h.batch_size() : h.micro_batch_size();
  if (absl::Status s = CheckRange("hyper.micro_batch_size", micro, 1, h.batch_size()); !s.ok()) {
    return s;
  }
  if (h.batch_size() % micro != 0) {
    return Invalid("hyper.micro_batch_size",
                   absl::StrCat(micro, " does not divide batch_size ", h.batch_size()));
  }
  const uint64_t max_seq = std::min<uint64_t>(
      settings.max_seq_len, static_cast<uint64_t>(job.model.max_position_embeddings));
  if (absl::Status s = CheckRange("hyper.seq_len", h.seq_len(), 1, max_seq); !s.ok()) return s;
  if (absl::Status s = job.model.CheckSequenceLength(h.seq_len()); !s.ok()) {
    return Invalid("hyper.seq_len", s.message());
  }
  if (uint64_t{micro} * h.seq_len() > (uint64_t{1} << 22)) {
    return absl::ResourceExhaustedError(absl::StrCat("hyper.micro_batch_size: ", micro,
                                                     " x seq_len ", h.seq_len(),
                                                     " tokens per micro-batch exceed 4194304"));
  }
  engine::TrainerOptions& t = job.options.trainer;
  t.micro_batch_size = static_cast<int>(micro);
  t.seq_len = static_cast<int>(h.seq_len());
  job.options.grad_accumulation = static_cast<int>(h.batch_size() / micro);
  const uint32_t eval_windows = data.eval_windows() == 0 ? 8 * micro : data.eval_windows();
  job.options.eval_batches = static_cast<int>(std::max<uint32_t>(1, eval_windows / micro));

  if (absl::Status s = CheckFiniteRange("hyper.lr.peak_lr", h.lr().peak_lr(), 0, 10, true);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckRange("hyper.lr.warmup_steps", h.lr().warmup_steps(), 0, h.steps());
      !s.ok()) {
    return s;
  }
  if (!v1::LrSchedule::Decay_IsValid(h.lr().decay())) {
    return Invalid("hyper.lr.decay", absl::StrCat(h.lr().decay(), " is not a decay kind"));
  }
  if (absl::Status s =
          CheckFiniteRange("hyper.lr.min_lr_ratio", h.lr().min_lr_ratio(), 0, 1, false);
      !s.ok()) {
    return s;
  }
  t.lr.peak_lr = h.lr().peak_lr();
  t.lr.warmup_steps = h.lr().warmup_steps();
  t.lr.cosine = h.lr().decay() != v1::LrSchedule::CONSTANT;
  t.lr.total_steps = h.steps();
  t.lr.min_lr_ratio = h.lr().min_lr_ratio();
  const double beta1 = h.has_adam_beta1() ? h.adam_beta1() : kDefaultAdamBeta1;
  const double beta2 = h.has_adam_beta2() ? h.adam_beta2() : kDefaultAdamBeta2;
  const double eps = h.has_adam_eps() ? h.adam_eps() : kDefaultAdamEps;
  if (absl::Status s = CheckFiniteRange("hyper.adam_beta1", beta1, 0, 0.999999, false); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckFiniteRange("hyper.adam_beta2", beta2, 0, 0.999999, false); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckFiniteRange("hyper.adam_eps", eps, 0, 1, true); !s.ok()) return s;
  if (absl::Status s = CheckFiniteRange("hyper.weight_decay", h.weight_decay(), 0, 10, false);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckFiniteRange("hyper.grad_clip", h.grad_clip(), 0, 1e6, false); !s.ok()) {
    return s;
  }
  t.beta1 = beta1;
  t.beta2 = beta2;
  t.eps = eps;
  t.weight_decay = h.weight_decay();
  t.grad_clip = h.grad_clip();
  const uint32_t k = h.checkpoint_every_layers() == 0 ? 4 : h.checkpoint_every_layers();
  if (absl::Status s = CheckRange("hyper.checkpoint_every_layers", k, 1,
                                  static_cast<uint64_t>(std::max(1, job.model.num_hidden_layers)));
      !s.ok() && h.checkpoint_every_layers() != 0) {
    return s;
  }
  t.executor.checkpoint_interval =
      static_cast<int>(std::min<uint32_t>(k, std::max(1, job.model.num_hidden_layers)));
  if (data.eval_every_steps() > h.steps()) {
    return Invalid("data.eval_every_steps",
                   absl::StrCat(data.eval_every_steps(), " is more than hyper.steps ", h.steps()));
  }
  t.blas_threads = settings.threads;
  t.optimizer_threads = settings.threads;
  return absl::OkStatus();
}

constexpr uint64_t kMinFragmentBytes = 4096;  // bounds the fragments (and events) of a step
constexpr uint64_t kMaxHeadBlockRows = uint64_t{1} << 20;  // past any vocabulary in use

// Fragmented weight streaming and adaptive recomputation; the planner (PlanWithEngine) then
// checks the ring and the activation budget against the model and the arena.
absl::Status ValidateExecutor(const v1::ExecutorOptions& e, ValidatedJob& job) {
  engine::ExecutorOptions& x = job.options.trainer.executor;
  if (e.fragment_bytes() != 0 && e.weight_ring_bytes() == 0) {
    return Invalid("executor.fragment_bytes",
                   absl::StrCat(e.fragment_bytes(), " needs executor.weight_ring_bytes"));
  }
  if (e.fragment_bytes() != 0 && e.fragment_bytes() < kMinFragmentBytes) {
    return Invalid("executor.fragment_bytes",
                   absl::StrCat(e.fragment_bytes(), " is below ", kMinFragmentBytes));
  }
  const std::string policy = e.activation_policy().empty() ? "recompute" : e.activation_policy();
  absl::StatusOr<engine::ActivationPolicyKind> kind = engine::ParseActivationPolicy(policy);
  if (!kind.ok()) {
    return Invalid("executor.activation_policy",
                   absl::StrCat("'", policy.substr(0, 64),
                                "' is not \"recompute\", \"offload\" or \"adaptive\""));
  }
  if (absl::Status s = CheckRange("executor.head_block_rows", e.head_block_rows(), 0,
                                  kMaxHeadBlockRows);
      !s.ok()) {
    return s;
  }
  job.options.trainer.head_block_rows = static_cast<int>(e.head_block_rows());
  x.weight_ring_bytes = e.weight_ring_bytes();
  x.fragment_bytes = e.fragment_bytes();
  x.activation_budget_bytes = e.activation_budget_bytes();
  x.activation_policy = *kind;
  return absl::OkStatus();
}

// The planner's refusal of an executor option names the option ("weight_ring_bytes=..."):
// the job spec's field for it.
std::string ExecutorField(absl::string_view planner_message) {
  for (const char* option : {"weight_ring_bytes", "fragment_bytes", "activation_budget_bytes"}) {
    if (absl::StartsWith(planner_message, absl::StrCat(option, "="))) {
      return absl::StrCat("executor.", option);
    }
  }
  return "hyper";
}

uint64_t PhysicalRamBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

// The host memory a job may plan for: the physical RAM, or the daemon's max_ram_bytes when
// that is set and smaller.
uint64_t MachineRamLimit(const DaemonSettings& settings) {
  const uint64_t physical = PhysicalRamBytes();
  if (settings.max_ram_bytes != 0 && (physical == 0 || settings.max_ram_bytes < physical)) {
    return settings.max_ram_bytes;
  }
  return physical == 0 ? UINT64_MAX : physical;
}

const char* MachineRamLimitName(const DaemonSettings& settings) {
  return settings.max_ram_bytes != 0 && settings.max_ram_bytes == MachineRamLimit(settings)
             ? "the daemon's max_ram_bytes"
             : "physical RAM";
}

// The daemon's device as the planner sees it: memory figures exact, speeds nominal (the daemon
// does not probe the host, so no step time is predicted). A GPU computes from a bf16 copy with
// bf16 activations; the CPU device in fp32.
engine::planner::HardwareProfile DeviceProfile(const engine::DeviceOptions& device) {
  engine::planner::HardwareProfile hw;
  hw.cpu_device = device.kind == engine::DeviceKind::kCpu;
  hw.name = hw.cpu_device ? "megatraind-cpu-device" : "megatraind-cuda-device";
  hw.device_memory_bytes = device.arena_bytes;
  hw.dense_tflops = 0.1;
  hw.device_memory_gbps = 10;
  hw.h2d_gbps = device.link_gbps;
  hw.d2h_gbps = device.link_gbps;
  hw.link_latency_us = device.link_latency_us;
  hw.memcpy_gbps = 10;
  hw.host_memory_gbps = 10;
  hw.weight_bytes = hw.cpu_device ? 4 : 2;
  hw.activation_bytes = hw.cpu_device ? 4 : 2;
  return hw;
}

// Exact placement and device plan from the engine's planner; refuses plans that do not fit.
absl::Status PlanWithEngine(const v1::MemoryBudgets& m, const DaemonSettings& settings,
                            ValidatedJob& job) {
  engine::planner::PlanInputs in;
  in.micro_batch = job.options.trainer.micro_batch_size;
  in.seq = job.options.trainer.seq_len;
  in.grad_accumulation = job.options.grad_accumulation;
  in.checkpoint_interval = job.options.trainer.executor.checkpoint_interval;
  in.weight_slots = job.options.trainer.executor.weight_slots;
  in.head_block_rows = job.options.trainer.head_block_rows;
  in.weight_ring_bytes = job.options.trainer.executor.weight_ring_bytes;
  in.fragment_bytes = job.options.trainer.executor.fragment_bytes;
  in.activation_budget_bytes = job.options.trainer.executor.activation_budget_bytes;
  in.activation_policy = job.options.trainer.executor.activation_policy;
  in.device_arena_bytes = job.options.device.arena_bytes;
  in.fixed_overhead_bytes = 0;
  const engine::HostMemoryBudgets& budgets = job.options.trainer.memory;
  in.budgets_enabled = budgets.enabled;
  in.budgets = budgets.budgets;
  in.states_on_nvme = budgets.states_on_nvme;
  in.master_on_nvme = budgets.master_on_nvme;
  in.grad_on_nvme = budgets.grad_on_nvme;
  in.compute_copy_on_nvme = budgets.compute_copy_on_nvme;
  in.nvme_chunk_bytes = budgets.nvme_chunk_bytes;
  in.steps = job.options.steps;
  in.drive_wear = settings.drive_wear;
  // A ring or an activation budget alone beyond the arena: name that field.
  for (const auto& [field, bytes] :
       {std::pair<const char*, uint64_t>{"executor.weight_ring_bytes", in.weight_ring_bytes},
        std::pair<const char*, uint64_t>{"executor.activation_budget_bytes",
                                         in.activation_budget_bytes}}) {
    if (bytes > job.options.device.arena_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(field, ": ", bytes,
                                                       " exceed the device arena of ",
                                                       job.options.device.arena_bytes, " bytes"));
    }
  }
  absl::StatusOr<engine::planner::PlanResult> plan =
      engine::planner::Plan(job.model, in, DeviceProfile(job.options.device));
  if (!plan.ok()) {
    if (plan.status().code() == absl::StatusCode::kResourceExhausted) {
      // The placement's refusal says which tier lacks how much; name that budget's field.
      const absl::string_view message = plan.status().message();
      const char* field = absl::StrContains(message, "of NVMe")  ? "memory.nvme_bytes"
                          : absl::StrContains(message, "of RAM") ? "memory.ram_bytes"
                                                                 : "memory";
      return absl::ResourceExhaustedError(absl::StrCat(field, ": ", message));
    }
    return Invalid(ExecutorField(plan.status().message()), plan.status().message());
  }
  // Never past the machine (issue 16, point 6): whatever the budgets say, the host bytes of the
  // plan (pinned + RAM + staging) must fit the physical RAM, or the daemon's max_ram_bytes.
  const uint64_t host_need =
      plan->placement.pinned_used + plan->placement.ram_used + plan->host_pinned_staging;
  if (host_need > MachineRamLimit(settings)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "memory: the plan needs ", host_need, " bytes of host memory (pinned ",
        plan->placement.pinned_used, ", RAM ", plan->placement.ram_used + plan->host_pinned_staging,
        "); this machine allows ", MachineRamLimit(settings), " (", MachineRamLimitName(settings),
        "); put buffers on NVMe (memory.nvme_dir) or use a smaller model or batch"));
  }
  if (!plan->fits_device) {
    return absl::ResourceExhaustedError(
        absl::StrCat("memory.device_arena_bytes: the executor's device plan peaks at ",
                     plan->device_arena_peak, " bytes; the arena has ",
                     job.options.device.arena_bytes, " (", plan->device.Describe(), ")"));
  }
  const engine::tiers::Placement& placement = plan->placement;
  if (placement.pinned_used > job.options.device.pinned_budget_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("memory.pinned_ram_bytes: the plan needs ", placement.pinned_used,
                     " pinned bytes (master, gradients); the budget is ",
                     job.options.device.pinned_budget_bytes));
  }
  const uint64_t ram_need = placement.ram_used + plan->host_pinned_staging;
  // With the NVMe tier the placement above already fitted the store into ram_bytes.
  if (m.ram_bytes() != 0 && m.nvme_dir().empty() && ram_need > m.ram_bytes()) {
    return absl::ResourceExhaustedError(absl::StrCat("memory.ram_bytes: the plan needs ", ram_need,
                                                     " bytes of RAM; the budget is ",
                                                     m.ram_bytes()));
  }
  for (int k = 0; k < engine::tiers::kNumBufferKinds; ++k) {
    const engine::tiers::KindPlacement& kind = placement.kinds[k];
    if (kind.tier == engine::tiers::Tier::kAbsent) continue;
    v1::BufferPlacement* p = job.plan.add_placements();
    p->set_kind(engine::tiers::BufferKindName(static_cast<engine::tiers::BufferKind>(k)));
    p->set_tier(engine::tiers::TierName(kind.tier));
    p->set_bytes(kind.bytes);
  }
  auto add_tier = [&](const char* tier, uint64_t bytes, uint64_t budget) {
    v1::TierUsage* t = job.plan.add_tiers();
    t->set_tier(tier);
    t->set_bytes(bytes);
    t->set_budget_bytes(budget);
  };
  add_tier("device", plan->device_arena_peak, job.options.device.arena_bytes);
  add_tier("pinned", placement.pinned_used, job.options.device.pinned_budget_bytes);
  add_tier("ram", ram_need, m.ram_bytes());
  if (placement.any_on_nvme() || !m.nvme_dir().empty()) {
    add_tier("nvme", placement.nvme_used, m.nvme_bytes());
  }
  job.plan.set_device_arena_peak_bytes(plan->device_arena_peak);
  job.plan.set_parameters(static_cast<uint64_t>(plan->parameters));
  // NVMe traffic (exact) and drive wear over the run (the daemon predicts no step time, so the
  // run is judged by hyper.steps x bytes written per step).
  job.plan.set_nvme_read_bytes_per_step(plan->nvme_traffic.read_bytes);
  job.plan.set_nvme_written_bytes_per_step(plan->nvme_traffic.written_bytes);
  job.plan.set_nvme_written_bytes_per_run(plan->drive_wear.written_per_run);
  if (!plan->drive_wear.warning.empty()) job.plan.add_warnings(plan->drive_wear.warning);
  return absl::OkStatus();
}

// The NVMe tier's directory: under an output root (the daemon writes state files there), on a
// block-backed filesystem that does O_DIRECT (the engine's check), with nvme_bytes free.
absl::Status ValidateNvme(const v1::MemoryBudgets& m, const PathPolicy& paths,
                          engine::tiers::TierBudgets& budgets) {
  if (m.nvme_dir().empty()) {
    if (m.nvme_bytes() != 0) {
      return Invalid("memory.nvme_bytes", absl::StrCat(m.nvme_bytes(), " without memory.nvme_dir"));
    }
    if (m.states_on_nvme()) return Invalid("memory.states_on_nvme", "needs memory.nvme_dir");
    if (m.master_on_nvme()) return Invalid("memory.master_on_nvme", "needs memory.nvme_dir");
    if (m.grad_on_nvme()) return Invalid("memory.grad_on_nvme", "needs memory.nvme_dir");
    if (m.compute_copy_on_nvme()) {
      return Invalid("memory.compute_copy_on_nvme", "needs memory.nvme_dir");
    }
    return absl::OkStatus();
  }
  if (m.nvme_bytes() == 0) {
    return Invalid("memory.nvme_bytes", "0 with memory.nvme_dir set: give the tier a size");
  }
  absl::StatusOr<std::string> dir = paths.ResolveOutput("memory.nvme_dir", m.nvme_dir());
  if (!dir.ok()) return dir.status();
  std::error_code ec;
  if (!std::filesystem::is_directory(*dir, ec)) {
    return absl::NotFoundError(
        absl::StrCat("memory.nvme_dir: '", *dir, "' is not an existing directory"));
  }
  if (absl::Status s = engine::tiers::CheckDirectIoDirectory(*dir); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("memory.nvme_dir: ", s.message()));
  }
  struct statvfs fs;
  if (statvfs(dir->c_str(), &fs) == 0) {
    const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
    if (m.nvme_bytes() > free_bytes) {
      return absl::FailedPreconditionError(
          absl::StrCat("memory.nvme_bytes: ", m.nvme_bytes(), " exceed the ", free_bytes,
                       " bytes free in memory.nvme_dir '", *dir, "'"));
    }
  }
  budgets.nvme_dir = *dir;
  budgets.nvme_bytes = m.nvme_bytes();
  return absl::OkStatus();
}

absl::Status ValidateMemory(const v1::MemoryBudgets& m, const DaemonSettings& settings,
                            const PathPolicy& paths, ValidatedJob& job) {
  engine::HostMemoryBudgets& budgets = job.options.trainer.memory;
  if (absl::Status s = ValidateNvme(m, paths, budgets.budgets); !s.ok()) return s;
  job.options.device = settings.device;
  if (m.device_arena_bytes() > settings.device.arena_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("memory.device_arena_bytes: ", m.device_arena_bytes(),
                     " exceed the daemon's device arena of ", settings.device.arena_bytes));
  }
  if (m.device_arena_bytes() != 0) job.options.device.arena_bytes = m.device_arena_bytes();
  if (m.pinned_ram_bytes() > settings.device.pinned_budget_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "memory.pinned_ram_bytes: ", m.pinned_ram_bytes(), " exceed the daemon's pinned budget of ",
        settings.device.pinned_budget_bytes));
  }
  if (m.pinned_ram_bytes() != 0) job.options.device.pinned_budget_bytes = m.pinned_ram_bytes();
  // A RAM budget or the NVMe tier: the engine places the store's buffers under the budgets
  // (engine/tiers/placement.h); without either, everything in RAM, copy endpoints pinned.
  if (m.ram_bytes() > MachineRamLimit(settings)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("memory.ram_bytes: ", m.ram_bytes(), " exceed this machine's ",
                     MachineRamLimit(settings), " bytes (", MachineRamLimitName(settings), ")"));
  }
  if (m.ram_bytes() != 0 || !m.nvme_dir().empty()) {
    budgets.enabled = true;
    budgets.budgets.pinned_ram = job.options.device.pinned_budget_bytes;
    // ram_bytes = 0 means "the machine's", never "unlimited".
    budgets.budgets.ram = m.ram_bytes() != 0 ? m.ram_bytes() : MachineRamLimit(settings);
    budgets.states_on_nvme = m.states_on_nvme();
    budgets.master_on_nvme = m.master_on_nvme();
    budgets.grad_on_nvme = m.grad_on_nvme();
    budgets.compute_copy_on_nvme = m.compute_copy_on_nvme();
    if (m.nvme_chunk_bytes() != 0) {
      if (m.nvme_chunk_bytes() % engine::tiers::kNvmeChunkQuantumBytes != 0) {
        return Invalid(
            "memory.nvme_chunk_bytes",
            absl::StrCat(m.nvme_chunk_bytes(), " is not a multiple of 262144 (256 KiB)"));
      }
      budgets.nvme_chunk_bytes = m.nvme_chunk_bytes();
    }
  }
  return PlanWithEngine(m, settings, job);
}

}  // namespace

absl::StatusOr<ValidatedJob> ValidateJobSpec(const v1::JobSpec& spec,
                                             const DaemonSettings& settings,
                                             const PathPolicy& paths) {
  ValidatedJob job;
  if (spec.name().size() > 128) {
    return Invalid("name", absl::StrCat("of ", spec.name().size(), " bytes is longer than 128"));
  }
  for (unsigned char c : spec.name()) {
    if (c < 0x20 || c == 0x7f) return Invalid("name", "contains a control character");
  }
  if (absl::Status s = ValidateModel(spec.model(), settings, paths, job); !s.ok()) return s;
  if (absl::Status s = ValidateData(spec.data(), paths, job); !s.ok()) return s;
  if (absl::Status s = ValidateHyper(spec.hyper(), spec.data(), settings, job); !s.ok()) return s;
  if (absl::Status s = ValidateExecutor(spec.executor(), job); !s.ok()) return s;
  if (absl::Status s = ValidateMemory(spec.memory(), settings, paths, job); !s.ok()) return s;
  if (spec.checkpoints().keep_last() > 10000) {
    return Invalid("checkpoints.keep_last",
                   absl::StrCat(spec.checkpoints().keep_last(), " is more than 10000"));
  }
  if (spec.checkpoints().every_steps() > spec.hyper().steps()) {
    return Invalid("checkpoints.every_steps",
                   absl::StrCat(spec.checkpoints().every_steps(), " is more than hyper.steps ",
                                spec.hyper().steps()));
  }
  job.options.checkpoint_every = static_cast<int>(
      std::min<uint64_t>(spec.checkpoints().every_steps(), std::numeric_limits<int>::max()));
  job.options.keep_last = static_cast<int>(spec.checkpoints().keep_last());
  if (!spec.output_dir().empty()) {
    absl::StatusOr<std::string> out = paths.ResolveOutput("output_dir", spec.output_dir());
    if (!out.ok()) return out.status();
    job.output_dir = *out;
    job.reuse_output_dir = spec.reuse_output_dir();
  } else if (spec.reuse_output_dir()) {
    return Invalid("reuse_output_dir", "true without output_dir");
  }
  job.options.seed = spec.seed();
  job.data_roots = paths.data_roots();
  return job;
}

}  // namespace megatrain::service
