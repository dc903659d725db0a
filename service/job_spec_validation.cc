// Job spec validation (see job_spec_validation.h).
#include "service/job_spec_validation.h"

#include <algorithm>
#include <filesystem>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/exec/activation_policy.h"
#include "engine/exec/streaming_executor.h"
#include "engine/model/hf_loader.h"
#include "engine/model/parameter_layout.h"
#include "engine/train/multi_device_step.h"
#include "service/data_spec_validation.h"
#include "service/hf_directory_files.h"
#include "service/hosts_spec_validation.h"
#include "service/memory_spec_validation.h"
#include "service/spec_field_checks.h"

namespace megatrain::service {
namespace {

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
  if (!h.grad_clip_rule().empty()) {
    absl::StatusOr<engine::GradClipRule> rule = engine::ParseGradClipRule(h.grad_clip_rule());
    if (!rule.ok()) return Invalid("hyper.grad_clip_rule", rule.status().message());
    t.grad_clip_rule = *rule;
  }
  if (t.grad_clip_rule == engine::GradClipRule::kPreviousNorm && t.grad_clip == 0) {
    return Invalid("hyper.grad_clip_rule",
                   "previous_norm needs a clip (hyper.grad_clip > 0; 0 turns clipping off)");
  }
  if (h.has_grad_clip_headroom()) {
    if (t.grad_clip_rule != engine::GradClipRule::kPreviousNorm) {
      return Invalid("hyper.grad_clip_headroom", "set without hyper.grad_clip_rule previous_norm");
    }
    if (absl::Status s =
            CheckFiniteRange("hyper.grad_clip_headroom", h.grad_clip_headroom(), 1, 1000, false);
        !s.ok()) {
      return s;
    }
    t.grad_clip_headroom = h.grad_clip_headroom();
  }
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
  {
    const std::string name =
        e.gradient_accumulation().empty() ? "auto" : e.gradient_accumulation();
    absl::StatusOr<engine::GradientAccumulation> accumulation =
        engine::ParseGradientAccumulation(name);
    if (!accumulation.ok()) {
      return Invalid("executor.gradient_accumulation",
                     absl::StrCat("'", name.substr(0, 64), "' is not \"host\", \"device\" or "
                                  "\"auto\""));
    }
    x.gradient_accumulation = *accumulation;
  }
  {
    const std::string name = e.gradient_reduction().empty() ? "auto" : e.gradient_reduction();
    absl::StatusOr<engine::GradientReduction> reduction = engine::ParseGradientReduction(name);
    if (!reduction.ok()) {
      return Invalid("executor.gradient_reduction",
                     absl::StrCat("'", name.substr(0, 64), "' is not \"host\", \"devices\", "
                                  "\"device_shards\" or \"auto\""));
    }
    job.options.trainer.gradient_reduction = *reduction;
  }
  x.weight_ring_bytes = e.weight_ring_bytes();
  x.fragment_bytes = e.fragment_bytes();
  x.activation_budget_bytes = e.activation_budget_bytes();
  x.activation_policy = *kind;
  return absl::OkStatus();
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
  if (spec.devices() > settings.devices) {
    return absl::ResourceExhaustedError(
        absl::StrCat("devices: ", spec.devices(), " is more than the ", settings.devices,
                     " device(s) this daemon drives (0 and 1 = one)"));
  }
  if (absl::Status s = ValidateModel(spec.model(), settings, paths, job); !s.ok()) return s;
  if (absl::Status s = ValidateData(spec.data(), paths, job); !s.ok()) return s;
  if (absl::Status s = ValidateHyper(spec.hyper(), spec.data(), settings, job); !s.ok()) return s;
  // Several devices each run the spec's batch (docs/scale_out.md "Several devices in one
  // process"): micro-batch m of a step on device m % devices, results those of one device with
  // devices x the accumulation.
  job.options.devices = static_cast<int>(std::max<uint32_t>(1, spec.devices()));
  job.options.grad_accumulation *= job.options.devices;
  // Ranks on several machines likewise (docs/scale_out.md "Jobs on several machines"): each
  // runs devices x the spec's batch; the run's accumulation counts every rank's.
  if (absl::Status s = ValidateHosts(spec, settings.allowed_hosts,
                                     settings.plan_for_other_machine || settings.any_host, job);
      !s.ok()) {
    return s;
  }
  job.options.grad_accumulation *= job.ranks;
  job.options.trainer.zero1 = spec.zero1();
  if (absl::Status s = ValidateExecutor(spec.executor(), job); !s.ok()) return s;
  // Checked against the placement by ValidateMemory (the engine's own rule, not a copy of it).
  job.options.trainer.speculative_update = spec.speculative_update();
  if (absl::Status s = ValidateMemory(spec.memory(), settings, paths, job); !s.ok()) return s;
  if (job.options.devices > 1 && job.options.trainer.memory.compute_copy_on_nvme) {
    return Invalid("memory.compute_copy_on_nvme",
                   absl::StrCat("true with devices ", job.options.devices,
                                ": several devices read the compute copy from RAM only"));
  }
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
  job.plan.set_devices(std::max<uint32_t>(1, spec.devices()));
  job.data_roots = paths.data_roots();
  if (!job.hosts.empty()) job.spec = spec;
  return job;
}

}  // namespace megatrain::service
