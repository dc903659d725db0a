// A training run: data, trainer, checkpoints, and the step loop with evaluation (see
// training_run.h).
#include "engine/train/training_run.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/status_macros.h"
#include "engine/data/byte_tokenizer.h"
#include "engine/data/token_windows.h"
#include "engine/device/device_factory.h"
#include "engine/model/parameter_layout.h"
#include "engine/exec/executor_geometry.h"
#include "engine/train/data_parallel_step.h"
#include "engine/train/run_checkpoints.h"
#include "engine/train/sampler.h"
#include "engine/train/training_data.h"

namespace megatrain::engine {
namespace {

std::string FormatDuration(double seconds) {
  const int s = static_cast<int>(std::lround(std::max(0.0, seconds)));
  return s >= 60 ? absl::StrFormat("%dm%02ds", s / 60, s % 60) : absl::StrFormat("%ds", s);
}

// The run's devices: the caller's shared ones, or options.devices created from options.device
// (CUDA ordinals counted from cuda_device_ordinal).
absl::StatusOr<std::vector<Device*>> RunDevices(const TrainingRunOptions& options,
                                                std::vector<std::unique_ptr<Device>>& owned) {
  const size_t wanted = static_cast<size_t>(options.devices);
  if (!options.shared_devices.empty()) {
    if (options.shared_devices.size() < wanted) {
      return absl::InvalidArgumentError(absl::StrCat("devices=", options.devices, " but only ",
                                                     options.shared_devices.size(),
                                                     " devices are available"));
    }
    return std::vector<Device*>(options.shared_devices.begin(),
                                options.shared_devices.begin() + options.devices);
  }
  if (options.shared_device != nullptr) {
    if (wanted != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("devices=", options.devices, " but the run was given one shared device"));
    }
    return std::vector<Device*>{options.shared_device};
  }
  if (wanted > 1 && options.device.kind == DeviceKind::kCuda &&
      !options.device.cuda_host_task_threads) {
    // A gradient turn waits in a host task: on the driver's one callback thread it would hold
    // back every other device's host tasks, the ones it waits for included.
    return absl::InvalidArgumentError(absl::StrCat(
        "devices=", options.devices, " on cuda needs cuda_host_task_threads (a host-task thread "
        "per stream)"));
  }
  std::vector<Device*> devices;
  for (size_t d = 0; d < wanted; ++d) {
    DeviceOptions device_options = options.device;
    device_options.cuda_device_ordinal += static_cast<int>(d);
    absl::StatusOr<std::unique_ptr<Device>> created = CreateDevice(device_options);
    if (!created.ok()) {
      if (wanted == 1) return created.status();
      return absl::Status(created.status().code(),
                          absl::StrCat("device ", d, ": ", created.status().message()));
    }
    owned.push_back(*std::move(created));
    devices.push_back(owned.back().get());
  }
  return devices;
}

}  // namespace

absl::StatusOr<GradientAccumulation> RunGradientAccumulation(const TrainingRunOptions& options) {
  const dist::Communicator* comm = options.trainer.communicator;
  const int ranks = comm != nullptr ? comm->size() : 1;
  // Several devices, or one device per rank reduce-scattering among the ranks: Trainer::Create
  // decides with the gradient reduction (a reduce-scatter sums on the devices, turns on the host
  // do not).
  const GradientReduction reduction = options.trainer.gradient_reduction;
  const bool among_ranks =
      ranks > 1 && (reduction == GradientReduction::kDevices ||
                    reduction == GradientReduction::kDeviceShards);
  if (options.devices > 1 || among_ranks) return options.trainer.executor.gradient_accumulation;
  return GradientAccumulationForRun(
      options.trainer.executor.gradient_accumulation,
      options.grad_accumulation / std::max(1, ranks * options.devices), options.devices);
}

namespace {

// A trainer on `devices` with its starting weights: the Hugging Face model's, or random.
absl::StatusOr<std::unique_ptr<Trainer>> StartingTrainer(const std::vector<Device*>& devices,
                                                         const ModelConfig& config,
                                                         const TrainingRunOptions& options,
                                                         TrainingObserver& observer) {
  for (Device* device : devices) {
    if (absl::Status health = device->health(); !health.ok()) return health;
  }
  TrainerOptions trainer_options = options.trainer;
  // Packed sample rows carry segment ids; the executor reads them only when asked to (on CUDA
  // they rule out cuDNN's attention).
  trainer_options.executor.segment_ids = RunUsesSegmentIds(options);
  absl::StatusOr<GradientAccumulation> accumulation = RunGradientAccumulation(options);
  if (!accumulation.ok()) return accumulation.status();
  trainer_options.executor.gradient_accumulation = *accumulation;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      Trainer::Create(devices, config, trainer_options);
  if (!trainer.ok()) return trainer.status();
  if (!(*trainer)->placement_table().empty()) {
    observer.OnLine("memory placement:\n" + (*trainer)->placement_table(), true);
  }
  if (const DeviceMemoryPlan& plan = (*trainer)->executor().plan(); plan.gradient_sums > 0) {
    observer.OnLine(absl::StrFormat("gradient accumulation: on the device (%.1f MiB of fp32 "
                                    "sums; only each step's last micro-batch copies gradients out)",
                                    plan.gradient_sums / double{1 << 20}),
                    true);
  }
  if (const DeviceReduction* reduction = (*trainer)->device_reduction(); reduction != nullptr) {
    const bool every = (*trainer)->executor().reduces_every_micro_batch();
    observer.OnLine(
        absl::StrCat("gradient reduction: a reduce-scatter among the ", reduction->world(),
                     (*trainer)->reduces_across_ranks() ? " ranks' devices (" : " devices (",
                     std::string(reduction->order()), ")",
                     every ? " of every micro-batch's gradients; each keeps the sum of its 1/"
                           : "; each copies out 1/",
                     reduction->world(),
                     every ? " and copies it out once a step" : " of every gradient it summed",
                     (*trainer)->reduces_across_ranks() ? ", and the ranks all-gather the shards"
                                                        : ""),
        true);
  }
  // Checkpoints the arena could not hold (auto device_checkpoints) live in pinned host memory and
  // cost a copy out and back every micro-batch: say so.
  if (const DeviceMemoryPlan& plan = (*trainer)->executor().plan(); plan.host_checkpoints > 0) {
    observer.OnLine(absl::StrCat("activation checkpoints: ", plan.device_checkpoints,
                                 " on the device, ", plan.host_checkpoints,
                                 " in pinned host memory (device memory: ", plan.Describe(), ")"),
                    true);
  }
  if (options.init_from_hf_dir.empty()) {
    (*trainer)->InitializeRandom(options.seed);
  } else if (absl::Status s = (*trainer)->LoadHfWeights(options.init_from_hf_dir, options.inputs);
             !s.ok()) {
    return s;
  }
  return trainer;
}

// Evaluates the validation batches; NaN when the run holds no validation windows out, or when
// none of their targets counts (held-out samples whose loss masks are all 0).
absl::StatusOr<double> Evaluate(Trainer& trainer, const std::vector<WindowBatch>& validation,
                                bool with_segments) {
  const bool any_counted = std::any_of(validation.begin(), validation.end(), [](const WindowBatch& b) {
    return std::any_of(b.targets.begin(), b.targets.end(), [](int32_t t) { return t >= 0; });
  });
  if (!any_counted) return std::numeric_limits<double>::quiet_NaN();
  std::vector<const int32_t*> in, tg;
  std::vector<TokenLayout> layouts;
  for (const WindowBatch& b : validation) {
    in.push_back(b.inputs.data());
    tg.push_back(b.targets.data());
    layouts.push_back(LayoutOf(b, with_segments));
  }
  return trainer.Evaluate(in, tg, layouts);
}

// What the progress line says about the data.
std::string DescribeData(const TrainingData& data, const BatchSource& batches, int seq_len) {
  if (data.samples != nullptr) {
    const SampleBatches& s = *data.samples;
    const std::string without_targets =
        s.truncated_without_targets() == 0
            ? std::string()
            : absl::StrFormat(" (%d of them keep no assistant token and train nothing: raise "
                              "seq_len, or shorten their prompts)",
                              s.truncated_without_targets());
    return absl::StrFormat(
        "%d train / %d validation samples (%d validation rows of %d), %d truncated to "
        "seq_len+1%s, %d dropped (under 2 tokens)",
        s.train_samples(), s.validation_samples(), s.validation_windows(), seq_len,
        s.truncated_samples(), without_targets, s.dropped_samples());
  }
  return absl::StrFormat("%d documents, %d tokens (%d train / %d validation windows of %d)",
                         data.documents, data.source->size(), batches.train_windows(),
                         batches.validation_windows(), seq_len);
}

// Replies to the run's eval prompts with the weights after the last step (see
// TrainingRunOptions::eval_prompts); CANCELLED as soon as the observer asks to stop (polled
// between generated tokens).
absl::StatusOr<std::vector<EvalReplyReport>> EvalReplies(Trainer& trainer,
                                                         const TrainingRunOptions& options,
                                                         TrainingObserver& observer) {
  std::vector<std::vector<int32_t>> prompts;
  for (const EvalPrompt& p : options.eval_prompts) prompts.push_back(p.ids);
  SamplingOptions greedy;
  greedy.max_new_tokens = options.eval_reply_tokens;
  greedy.stop_tokens = options.eval_stop_ids;
  greedy.vocab_limit = options.eval_vocab_limit;
  greedy.interrupted = [&observer] { return observer.ShouldStop(); };
  Sampler sampler(trainer, options.trainer.seq_len, options.trainer.micro_batch_size);
  absl::StatusOr<std::vector<GreedyReply>> replies = sampler.GenerateGreedy(prompts, greedy);
  if (!replies.ok()) return replies.status();
  std::vector<EvalReplyReport> reports;
  for (size_t i = 0; i < replies->size(); ++i) {
    EvalReplyReport& r = reports.emplace_back();
    r.index = static_cast<int>(i);
    r.prompt = options.eval_prompts[i].text;
    r.ids = std::move((*replies)[i].ids);
    r.stopped = (*replies)[i].stopped;
  }
  return reports;
}

// Several devices: each one's exposed transfer in the step ("  stall 0.012/0.020 s"), by device.
std::string DescribeDeviceStalls(const StepReport& report) {
  if (report.devices.size() < 2) return "";
  std::string stalls;
  for (const DeviceStepFigures& d : report.devices) {
    absl::StrAppend(&stalls, stalls.empty() ? "" : "/", absl::StrFormat("%.3f", d.stall_seconds));
  }
  return absl::StrCat("  stall ", stalls, " s");
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}

}  // namespace

std::string TrainingJobJson(const TrainingRunOptions& o) {
  const TrainerOptions& t = o.trainer;
  const bool text = RunDataIsText(o);
  nlohmann::json j = {
      {"kind", "text"},
      {"init_from_hf_dir", o.init_from_hf_dir},
      {"text_paths", text ? o.text_paths : std::vector<std::string>()},
      {"token_files", text ? std::vector<std::string>() : o.token_files},
      {"token_format", text ? "" : o.token_format},
      {"tokenizer", text ? o.tokenizer : ""},
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
  if (RunDataIsSamples(o)) {
    // Only for sample-set runs, so the JSON of every other job is what it was before.
    j["kind"] = "sft";
    j["token_files"] = std::vector<std::string>();
    j["token_format"] = "";
    j["sft_sample_paths"] = o.sft_sample_paths;
    j["pack"] = o.pack;
    j["train_on_prompt"] = o.train_on_prompt;
    j["overlong"] = o.overlong;
  }
  // Only when it is not the default, so the JSON (and the resume check) of jobs that never set
  // it is what it was before the option existed.
  const int head_block_rows = t.head_block_rows > 0 ? t.head_block_rows : kDefaultHeadBlockRows;
  if (head_block_rows != kDefaultHeadBlockRows) j["head_block_rows"] = head_block_rows;
  if (t.grad_clip_rule != GradClipRule::kExact) {
    j["grad_clip_rule"] = GradClipRuleName(t.grad_clip_rule);
    j["grad_clip_headroom"] = t.grad_clip_headroom;
  }
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

absl::StatusOr<TrainingRunResult> RunTraining(
    const ModelConfig& config, const TrainingRunOptions& options,
    const std::function<void(const std::string&, bool)>& progress) {
  class LineObserver : public TrainingObserver {
   public:
    explicit LineObserver(const std::function<void(const std::string&, bool)>& f) : f_(f) {}
    void OnLine(const std::string& line, bool keep) override { f_(line, keep); }

   private:
    const std::function<void(const std::string&, bool)>& f_;
  };
  LineObserver observer(progress);
  return RunTraining(config, options, observer);
}

namespace {

// What the observers asked for before a step.
struct ObserverRequests {
  bool stop = false;
  bool checkpoint_before_stop = false;
  bool checkpoint_now = false;
};

// This rank's own stop request (its checkpoint-now request is polled after the step).
absl::StatusOr<ObserverRequests> LocalStopRequest(TrainingObserver& observer) {
  ObserverRequests r;
  r.stop = observer.ShouldStop();
  r.checkpoint_before_stop = r.stop && observer.CheckpointBeforeStop();
  return r;
}

// Every rank's requests, agreed in one sum: counts of stopping ranks, of those wanting a
// checkpoint first, and of checkpoint-now requests, in 20-bit fields (ranks < 2^20). A
// checkpoint-now request counts on rank 0 only: every rank hears it, and a copy arriving late on
// another rank would otherwise checkpoint the next step again (the others only clear theirs).
absl::StatusOr<ObserverRequests> AgreedRequests(dist::Communicator& comm,
                                                TrainingObserver& observer) {
  const bool stop = observer.ShouldStop();
  const bool keep = stop && observer.CheckpointBeforeStop();
  const bool now = observer.ShouldCheckpoint() && comm.rank() == 0;
  constexpr int kBits = 20;
  constexpr int64_t kMask = (int64_t{1} << kBits) - 1;
  absl::StatusOr<int64_t> sum = comm.SumInt64(int64_t{stop} | (int64_t{keep} << kBits) |
                                              (int64_t{now} << (2 * kBits)));
  if (!sum.ok()) return sum.status();
  const int64_t stopping = *sum & kMask;
  const int64_t keeping = (*sum >> kBits) & kMask;
  ObserverRequests r;
  r.stop = stopping > 0;
  r.checkpoint_before_stop = r.stop && keeping == stopping;
  r.checkpoint_now = (*sum >> (2 * kBits)) > 0;
  return r;
}

}  // namespace

absl::StatusOr<TrainingRunResult> RunTraining(const ModelConfig& config,
                                               const TrainingRunOptions& options,
                                               TrainingObserver& observer) {
  auto progress = [&observer](const std::string& line, bool keep) { observer.OnLine(line, keep); };
  if (options.grad_accumulation < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("grad_accumulation=", options.grad_accumulation, " must be >= 1"));
  }
  if (options.devices < 1 || options.grad_accumulation % options.devices != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "grad_accumulation=", options.grad_accumulation, " must be a multiple of devices=",
        options.devices, " (micro-batch m of a step runs on device m % devices)"));
  }
  const int micro = options.trainer.micro_batch_size;
  // Data parallelism: this rank's micro-batch slots of each step. Replicated, rank 0 writes the
  // checkpoints in the background; ZeRO-1, every rank writes its shard of each one together,
  // synchronously at the same step (a collective).
  dist::Communicator* comm = options.trainer.communicator;
  absl::StatusOr<RankSlots> slots =
      comm != nullptr ? RankSlotsOf(options.grad_accumulation, comm->rank(), comm->size())
                      : RankSlots{0, options.grad_accumulation};
  if (!slots.ok()) return slots.status();
  if (comm != nullptr && slots->count % options.devices != 0) {
    // Each rank spreads its slots over its devices as one process does.
    return absl::InvalidArgumentError(absl::StrCat(
        "grad_accumulation=", options.grad_accumulation, " over ", comm->size(),
        " ranks gives each rank ", slots->count, " micro-batches, not a multiple of devices=",
        options.devices, " (it must be a multiple of ranks x devices)"));
  }
  const bool zero1 = comm != nullptr && options.trainer.zero1;
  const bool writes_checkpoints = comm == nullptr || comm->rank() == 0 || zero1;
  absl::StatusOr<TrainingData> data = PrepareTrainingData(config, options);
  if (!data.ok()) return data.status();
  BatchSource& windows = *data->batches;
  const bool segment_ids = RunUsesSegmentIds(options);

  std::vector<std::unique_ptr<Device>> owned_devices;
  absl::StatusOr<std::vector<Device*>> devices = RunDevices(options, owned_devices);
  if (!devices.ok()) return devices.status();
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      StartingTrainer(*devices, config, options, observer);
  if (!trainer.ok()) return trainer.status();
  absl::StatusOr<SafetensorsDtype> checkpoint_dtype = RunCheckpointDtype(options);
  if (!checkpoint_dtype.ok()) return checkpoint_dtype.status();
  absl::StatusOr<std::unique_ptr<RunCheckpoints>> checkpoints =
      RunCheckpoints::Create(options, *checkpoint_dtype);
  if (!checkpoints.ok()) return checkpoints.status();

  TrainingRunResult result;
  uint64_t first_step = 1;
  absl::StatusOr<std::optional<ResumePoint>> resumed = (*checkpoints)->Resume(**trainer);
  if (!resumed.ok()) return resumed.status();
  if (resumed->has_value()) {
    windows.set_cursor((*resumed)->data_cursor);
    first_step = (*resumed)->step + 1;
    result.resumed_from_step = (*resumed)->step;
    progress(absl::StrFormat("resumed from %s at step %d", (*resumed)->path, (*resumed)->step),
             true);
  }
  if (comm != nullptr) {
    comm->NoteStep(first_step);
    // ZeRO-1 is not in the job JSON (its checkpoints resume without it and the other way round),
    // but every rank must agree on it: the two run different collectives.
    // Nor is where the gradients live (RAM or NVMe chunks): ranks must reduce them in the same
    // pieces. (The gradient reduction they agreed on in Trainer::Create, before making it.)
    MT_RETURN_IF_ERROR(CheckSameJob(
        *comm, absl::StrCat(TrainingJobJson(options), " from step ", first_step,
                            zero1 ? " zero1" : "", " gradients ",
                            GradientLayoutFingerprint((*trainer)->store()))));
  }
  result.parameters = (*trainer)->layout().parameter_count();
  result.unigram_entropy_nats = data->unigram_entropy_nats;
  progress(absl::StrFormat("model: %d parameters, %d layers, d=%d; data: %s%s",
                           result.parameters, config.num_hidden_layers, config.hidden_size,
                           DescribeData(*data, windows, options.trainer.seq_len),
                           // Computed for text only: token files carry no corpus, and a
                           // sample set's loss counts only masked targets.
                           RunDataIsText(options)
                               ? absl::StrFormat("; unigram entropy %.3f nats",
                                                 result.unigram_entropy_nats)
                               : ""),
           true);

  absl::StatusOr<std::vector<WindowBatch>> validation_batches =
      ValidationBatches(windows, options.eval_batches, micro);
  if (!validation_batches.ok()) return validation_batches.status();
  const std::vector<WindowBatch> validation = *std::move(validation_batches);
  absl::StatusOr<double> initial = Evaluate(**trainer, validation, segment_ids);
  if (!initial.ok()) return initial.status();
  result.initial_validation_loss = *initial;
  double validation_loss = *initial;
  progress(validation.empty()
               ? absl::StrFormat("step 0/%d  no validation windows (validation_fraction 0)",
                                 options.steps)
               : absl::StrFormat("step 0/%d  validation loss %.4f", options.steps, *initial),
           true);

  // The eval prompts' replies, on the rank that writes checkpoints. A failure (no device memory
  // for the logits, a prompt id outside the model) is reported once and ends them for this run:
  // they are a look at the model, never a reason to stop training.
  bool eval_prompts_on = !options.eval_prompts.empty() && writes_checkpoints;
  auto reply_to_eval_prompts = [&](uint64_t after_step) {
    if (!eval_prompts_on) return;
    absl::StatusOr<std::vector<EvalReplyReport>> replies =
        EvalReplies(**trainer, options, observer);
    if (absl::IsCancelled(replies.status())) {
      // A stop (cancel, pause, shutdown) asked for during the round: the round ends unreported
      // and the loop's next ShouldStop ends the run; the next run's rounds are unaffected.
      progress(absl::StrCat("eval prompts: the round after step ", after_step,
                            " ended early: a stop was requested"),
               true);
      return;
    }
    if (!replies.ok()) {
      eval_prompts_on = false;
      progress(absl::StrCat("eval prompts: no replies in this run: ", replies.status().message()),
               true);
      return;
    }
    observer.OnEvalReplies(after_step, *replies);
  };
  reply_to_eval_prompts(first_step - 1);

  RunCheckpoints& run_checkpoints = **checkpoints;
  // A run that ends early (a failed step, a stop) still reports a checkpoint that was being
  // written beside it (the write is finished, never abandoned): the daemon records it as the
  // job's newest.
  absl::Cleanup report_last_checkpoint = [&] { (void)run_checkpoints.Collect(observer); };
  std::vector<double> speeds;
  double elapsed = 0;
  // Writes a checkpoint of the step just taken: ZeRO-1 on every rank together, else in the
  // background.
  uint64_t checkpointed_step = 0;  // the last step a checkpoint was started for
  auto checkpoint = [&](uint64_t of_step) -> absl::Status {
    checkpointed_step = of_step;
    return zero1 ? run_checkpoints.WriteSharded(**trainer, windows.cursor(), *comm, observer)
                 : run_checkpoints.Start(**trainer, windows.cursor(), observer);
  };
  const bool agreeing = comm != nullptr && options.agree_on_requests;
  for (uint64_t step = first_step; step <= options.steps; ++step) {
    if (comm != nullptr) comm->NoteStep(step);
    absl::StatusOr<ObserverRequests> requests =
        agreeing ? AgreedRequests(*comm, observer) : LocalStopRequest(observer);
    if (!requests.ok()) return requests.status();
    if (requests->stop) {
      // Unagreed, an observer's stop is this rank's own; a ZeRO-1 checkpoint needs every rank,
      // so none is written for it.
      // Not twice for one step (a checkpoint request answered just before the stop).
      const bool keep = run_checkpoints.enabled() && writes_checkpoints && (!zero1 || agreeing) &&
                        step > first_step && checkpointed_step != step - 1 &&
                        requests->checkpoint_before_stop;
      if (keep) MT_RETURN_IF_ERROR(checkpoint(step - 1));
      if (absl::Status s = run_checkpoints.Collect(observer); !s.ok()) return s;
      return absl::CancelledError(
          absl::StrCat("stopped before step ", step, keep ? " (checkpoint written)" : ""));
    }
    std::vector<WindowBatch> batches;
    std::vector<const int32_t*> in, tg;
    std::vector<TokenLayout> layouts;
    for (int m = 0; m < options.grad_accumulation; ++m) {
      absl::StatusOr<WindowBatch> batch = windows.NextTrainBatch(micro);
      if (!batch.ok()) {
        return absl::Status(batch.status().code(), absl::StrCat("step ", step, ": training data: ",
                                                                batch.status().message()));
      }
      batches.push_back(*std::move(batch));
    }
    for (int m = slots->first; m < slots->first + slots->count; ++m) {
      const WindowBatch& b = batches[m];
      in.push_back(b.inputs.data());
      tg.push_back(b.targets.data());
      layouts.push_back(LayoutOf(b, segment_ids));
    }
    absl::StatusOr<StepReport> report = (*trainer)->Step(in, tg, layouts);
    if (!report.ok()) return report.status();
    elapsed += report->step_seconds;
    if (step > first_step) speeds.push_back(report->tokens_per_second);
    result.final_train_loss = report->loss;
    const bool evaluate_now =
        step == options.steps || (options.eval_every > 0 && step % options.eval_every == 0);
    if (evaluate_now) {
      absl::StatusOr<double> v = Evaluate(**trainer, validation, segment_ids);
      if (!v.ok()) return v.status();
      validation_loss = *v;
      reply_to_eval_prompts(step);
    }
    // Every ZeRO-1 rank must decide alike: only the schedule or an agreed request, never one
    // rank's observer alone.
    const bool requested = agreeing ? requests->checkpoint_now
                                    : (!zero1 && observer.ShouldCheckpoint());
    const bool checkpoint_now =
        run_checkpoints.enabled() && writes_checkpoints &&
        (step == options.steps ||
         (options.checkpoint_every > 0 && step % options.checkpoint_every == 0) || requested);
    if (checkpoint_now) {
      MT_RETURN_IF_ERROR(checkpoint(step));
      // An agreed request is answered once written (its requester waits for the checkpoint's
      // report); the other ranks wait for rank 0 at the next agreement.
      if (step == options.steps || (agreeing && requested)) {
        if (absl::Status s = run_checkpoints.Collect(observer); !s.ok()) return s;
      }
    }
    const double eta = elapsed / static_cast<double>(step - first_step + 1) *
                       static_cast<double>(options.steps - step);
    // Data parallelism: the step's collectives (time and payload bytes this rank sent).
    const std::string communication =
        comm != nullptr ? absl::StrFormat("  comm %.4f s %d B", report->communication_seconds,
                                          report->communication_bytes)
                        : std::string();
    // The NVMe tier's traffic since the last line (this rank's): the previous step's optimizer
    // pass and this step's gradients.
    const std::string nvme =
        report->nvme_bytes_read + report->nvme_bytes_written > 0
            ? absl::StrFormat("  nvme r %.1f w %.1f MB", report->nvme_bytes_read / 1e6,
                              report->nvme_bytes_written / 1e6)
            : std::string();
    progress(absl::StrFormat("step %d/%d  loss %.4f  val %.4f  lr %.2e  |g| %.3f  %.0f "
                             "tok/s%s%s%s  eta %s%s%s",
                             step, options.steps, report->loss, validation_loss,
                             report->learning_rate, report->grad_norm, report->tokens_per_second,
                             communication, nvme, DescribeDeviceStalls(*report),
                             FormatDuration(eta),
                             report->skipped              ? "  (skipped: non-finite)"
                             : report->no_counted_targets ? "  (no counted target: no update)"
                                                          : "",
                             !checkpoint_now ? ""
                             : zero1         ? "  (checkpoint written)"
                                             : "  (checkpoint started)"),
             evaluate_now || checkpoint_now);
    if (!checkpoint_now && run_checkpoints.Idle()) {
      // Report a checkpoint that finished beside this step.
      if (absl::Status s = run_checkpoints.Collect(observer); !s.ok()) return s;
    }
    observer.OnStep(*report, validation_loss);
    ++result.steps_run;
    if (report->speculated_entries > 0) {
      ++(report->speculation_committed ? result.speculations_committed
                                       : result.speculations_discarded);
    }
  }
  // The last step's optimizer update runs after its Step returned: a failure there would
  // otherwise pass unseen (and a final validation loss be reported for half-updated weights).
  if (absl::Status s = (*trainer)->UpdateStatus(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("the last step's optimizer update failed: ",
                                               s.message()));
  }
  result.final_validation_loss = validation_loss;
  result.last_checkpoint = run_checkpoints.last_checkpoint();
  result.tokens_per_second = Median(std::move(speeds));
  if (!options.chrome_trace_path.empty()) {
    std::ofstream out(options.chrome_trace_path);
    out << devices->front()->timeline().ToChromeTraceJson();
    if (!out) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot write chrome trace to '", options.chrome_trace_path, "'"));
    }
  }
  return result;
}

}  // namespace megatrain::engine
