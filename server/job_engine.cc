// DeviceJobEngine and device-fault classification (see job_engine.h).
#include "server/job_engine.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/common/safe_files.h"
#include "engine/data/tokenize_version.h"
#include "engine/device/device_factory.h"
#include "nlohmann/json.hpp"
#include "server/job_chat_samples.h"
#include "server/job_eval_prompts.h"
#include "server/job_lineage.h"
#include "server/job_result.h"

namespace megatrain::server {

bool IsDeviceFault(const absl::Status& status) {
  return status.code() == absl::StatusCode::kInternal &&
         absl::StrContains(status.message(), "device fault");
}

std::string JobCheckpointDir(const std::string& state_dir, const std::string& job_id,
                             const service::ValidatedJob& job) {
  if (!job.output_dir.empty() && job.reuse_output_dir) {
    return absl::StrCat(job.output_dir, "/checkpoints/", job_id);
  }
  if (!job.output_dir.empty()) return job.output_dir + "/checkpoints";
  return absl::StrCat(state_dir, "/jobs/", job_id, "/checkpoints");
}

std::string JobTokensDir(const std::string& state_dir, const std::string& job_id,
                         const service::ValidatedJob& job) {
  if (!job.output_dir.empty()) return job.output_dir + "/tokens";
  return absl::StrCat(state_dir, "/jobs/", job_id, "/tokens");
}

// Forwards everything to the runner's observer; counts steps and faults the CPU device once the
// test hook's count is reached, so the next step fails inside the real executor; decodes the
// eval prompts' replies with the chat tool first (a failure is reported and the reply's text
// says it was not decoded: the replies are a look at the model, never a reason to stop).
class DeviceJobEngine::FaultHookObserver final : public engine::TrainingObserver {
 public:
  FaultHookObserver(DeviceJobEngine& engine, engine::TrainingObserver& inner)
      : engine_(engine), inner_(inner) {}
  void set_eval_prompt_tool(const EvalPromptTool* tool) { eval_prompt_tool_ = tool; }
  void OnLine(const std::string& line, bool keep) override { inner_.OnLine(line, keep); }
  void OnStep(const engine::StepReport& report, double validation_loss) override {
    inner_.OnStep(report, validation_loss);
    const uint64_t after = engine_.options_.inject_device_fault_after_steps;
    if (++engine_.steps_run_ == after && engine_.cpu_device_ != nullptr) {
      engine_.cpu_device_->InjectFault(
          absl::StrCat("injected by --inject_device_fault_after_steps=", after));
    }
  }
  bool ShouldStop() override { return inner_.ShouldStop(); }
  bool CheckpointBeforeStop() override { return inner_.CheckpointBeforeStop(); }
  bool ShouldCheckpoint() override { return inner_.ShouldCheckpoint(); }
  void OnCheckpoint(uint64_t step, const std::string& path) override {
    inner_.OnCheckpoint(step, path);
  }
  void OnEvalReplies(uint64_t step, std::vector<engine::EvalReplyReport>& replies) override {
    if (eval_prompt_tool_ != nullptr) {
      absl::Status decoded = DecodeEvalReplies(*eval_prompt_tool_, replies,
                                               [this] { return inner_.ShouldStop(); });
      if (!decoded.ok()) {
        inner_.OnLine(absl::StrCat("eval prompts: the replies of step ", step,
                                   " were not decoded: ", decoded.message()),
                      true);
        for (engine::EvalReplyReport& r : replies) {
          r.text = absl::StrCat("[not decoded: ids ", absl::StrJoin(r.ids, ","), "]");
        }
      }
    }
    inner_.OnEvalReplies(step, replies);
  }

 private:
  DeviceJobEngine& engine_;
  engine::TrainingObserver& inner_;
  const EvalPromptTool* eval_prompt_tool_ = nullptr;
};

absl::StatusOr<std::unique_ptr<DeviceJobEngine>> DeviceJobEngine::Create(
    DeviceJobEngineOptions options) {
  if (options.inject_device_fault_after_steps != 0 &&
      options.device.kind != engine::DeviceKind::kCpu) {
    return absl::InvalidArgumentError(
        "inject_device_fault_after_steps: the fault hook exists only for the cpu device");
  }
  std::unique_ptr<engine::Device> device;
  engine::CpuDevice* cpu_device = nullptr;
  if (options.device.kind == engine::DeviceKind::kCpu) {
    absl::StatusOr<std::unique_ptr<engine::CpuDevice>> cpu =
        engine::CpuDevice::Create(options.device);
    if (!cpu.ok()) return cpu.status();
    cpu_device = cpu->get();
    device = std::move(*cpu);
  } else {
    absl::StatusOr<std::unique_ptr<engine::Device>> created = engine::CreateDevice(options.device);
    if (!created.ok()) return created.status();
    device = std::move(*created);
  }
  std::vector<std::unique_ptr<engine::Device>> more_devices;
  for (uint32_t d = 1; d < options.devices; ++d) {
    engine::DeviceOptions device_options = options.device;
    device_options.cuda_device_ordinal += static_cast<int>(d);
    absl::StatusOr<std::unique_ptr<engine::Device>> created = engine::CreateDevice(device_options);
    if (!created.ok()) {
      return absl::Status(created.status().code(),
                          absl::StrCat("device ", d, ": ", created.status().message()));
    }
    more_devices.push_back(*std::move(created));
  }
  return std::unique_ptr<DeviceJobEngine>(new DeviceJobEngine(std::move(options), std::move(device),
                                                              cpu_device, std::move(more_devices)));
}

absl::Status DeviceJobEngine::DeviceHealth() const {
  if (absl::Status health = device_->health(); !health.ok()) return health;
  for (const std::unique_ptr<engine::Device>& device : more_devices_) {
    if (absl::Status health = device->health(); !health.ok()) return health;
  }
  return absl::OkStatus();
}

std::vector<DeviceState> DeviceJobEngine::Devices() const {
  std::vector<DeviceState> states;
  auto add = [&](const engine::Device& device) {
    states.push_back({std::string(device.name()), device.arena_stats(), device.health()});
  };
  add(*device_);
  for (const std::unique_ptr<engine::Device>& device : more_devices_) add(*device);
  return states;
}

absl::Status DeviceJobEngine::Run(const std::string& job_id, const service::ValidatedJob& job,
                                  engine::TrainingObserver& runner_observer) {
  if (absl::Status health = DeviceHealth(); !health.ok()) return health;
  FaultHookObserver observer(*this, runner_observer);
  engine::TrainingRunOptions options = job.options;
  engine::InputFiles with_tokens;  // the checked inputs and the token file written for this run
  // Text is tokenized in the tokenizer process into a token file, streamed (issue 16, point 6):
  // the daemon never holds the corpus. Without the tool (a build that did not install it beside
  // megatraind, reported at start), byte-tokenizer text is still tokenized in memory.
  const bool bytes = options.tokenizer == "bytes";
  const std::string tokenize_binary =
      options_.tokenize_binary.empty() ? DefaultTokenizeBinary() : options_.tokenize_binary;
  if (!job.chat_paths.empty()) {
    if (absl::Status s = PrepareChatData(job_id, job, observer, options, with_tokens); !s.ok()) {
      return s;
    }
  } else if (engine::RunDataIsSamples(options)) {
    // Pre-made sample files: read as they are, through the held descriptors.
  } else if (options.token_files.empty() && bytes &&
             access(tokenize_binary.c_str(), X_OK) != 0) {
    observer.OnLine(absl::StrCat("tokenize_binary '", tokenize_binary,
                                 "' is missing: tokenizing the text in memory"),
                    true);
  } else if (options.token_files.empty()) {
    absl::StatusOr<JobTokens> tokens = TokenizeText(job_id, job, observer);
    if (!tokens.ok()) return tokens.status();
    absl::StatusOr<std::string> link = LinkJobTokens(*tokens, job_id);
    if (!link.ok()) return link.status();
    options.token_files = {*link};
    options.token_format = tokens->format;
    // A byte-tokenizer job keeps the identity it had when its text was tokenized in memory (its
    // checkpoints resume either way); SentencePiece jobs were always run from their token file.
    if (bytes) options.tokenized_text_documents = tokens->documents;
    if (options.inputs != nullptr) {
      // The run reads only held descriptors; the token file is the daemon's own output, opened
      // now (a regular file only) under the name the engine gives it.
      absl::StatusOr<engine::InputFiles> held = options.inputs->Clone();
      if (!held.ok()) return held.status();
      absl::StatusOr<engine::UniqueFd> fd = engine::OpenRegularFileForRead(tokens->path);
      if (!fd.ok()) return fd.status();
      held->Add(*link, *std::move(fd));
      with_tokens = *std::move(held);
      options.inputs = &with_tokens;
    }
  }
  options.checkpoint_dir = JobCheckpointDir(options_.state_dir, job_id, job);
  options.resume = true;
  if (absl::Status s = engine::MakeDirectories(options.checkpoint_dir); !s.ok()) {
    return absl::PermissionDeniedError(absl::StrCat("checkpoint directory: ", s.message()));
  }
  if (!job.hosts.empty()) {
    // The ranks' steps are not this daemon's device's (the fault hook counts those).
    return RunJobOverHosts(job_id, job, options, options_.hosts_launch, runner_observer);
  }
  EvalPromptTool eval_prompt_tool;
  if (!job.eval_prompts.empty()) {
    eval_prompt_tool.tool = options_.chat_tokenize_binary.empty() ? DefaultChatTokenizeBinary()
                                                                  : options_.chat_tokenize_binary;
    eval_prompt_tool.model_dir = job.options.init_from_hf_dir;
    eval_prompt_tool.inputs = job.options.inputs;
    absl::StatusOr<RenderedEvalPrompts> rendered = RenderEvalPrompts(
        eval_prompt_tool, job.eval_prompts, [&observer] { return observer.ShouldStop(); });
    if (!rendered.ok()) return rendered.status();
    size_t longest = 0;
    for (const engine::EvalPrompt& p : rendered->prompts) longest = std::max(longest, p.ids.size());
    observer.OnLine(absl::StrCat("eval prompts: ", rendered->prompts.size(),
                                 " rendered (the longest ", longest, " tokens); replies of up to ",
                                 job.eval_reply_tokens, " tokens at every evaluation"),
                    true);
    options.eval_prompts = std::move(rendered->prompts);
    options.eval_stop_ids = std::move(rendered->stop_ids);
    options.eval_vocab_limit = rendered->vocab_size;
    options.eval_reply_tokens = job.eval_reply_tokens;
    observer.set_eval_prompt_tool(&eval_prompt_tool);
  }
  options.shared_device = device_.get();
  options.shared_devices = {device_.get()};
  for (const std::unique_ptr<engine::Device>& device : more_devices_) {
    options.shared_devices.push_back(device.get());
  }
  absl::StatusOr<engine::TrainingRunResult> result =
      engine::RunTraining(job.model, options, observer);
  if (!result.ok()) return result.status();
  return WriteJobResult(job_id, job, *result, engine::RunDataIsText(options));
}

absl::Status DeviceJobEngine::PrepareChatData(const std::string& job_id,
                                             const service::ValidatedJob& job,
                                             engine::TrainingObserver& observer,
                                             engine::TrainingRunOptions& options,
                                             engine::InputFiles& held) {
  ChatSamplesRequest request;
  request.tool = options_.chat_tokenize_binary.empty() ? DefaultChatTokenizeBinary()
                                                       : options_.chat_tokenize_binary;
  request.model_dir = job.options.init_from_hf_dir;
  request.chat_paths = job.chat_paths;
  request.format = job.chat_format;
  request.tokens_dir = JobTokensDir(options_.state_dir, job_id, job);
  request.model_vocab_size = job.model.vocab_size;
  request.inputs = job.options.inputs;
  observer.OnLine(absl::StrCat("tokenizing ", job.chat_paths.size(), " chat file(s) (format ",
                               request.format, ") with the tokenizer and chat template of ",
                               request.model_dir, " into ", request.tokens_dir,
                               " (reused when present)"),
                  true);
  absl::StatusOr<ChatSamples> samples =
      PrepareChatSamples(request, [&observer] { return observer.ShouldStop(); });
  if (!samples.ok()) return samples.status();
  observer.OnLine(absl::StrCat(samples->reused ? "reusing sample file " : "tokenized into ",
                               samples->path, ": ", samples->samples, " samples, ",
                               samples->tokens, " tokens, ", samples->counted_tokens,
                               " counted tokens, vocab_size ", samples->vocab_size),
                  true);
  absl::StatusOr<std::string> link = LinkChatSamples(*samples, job_id);
  if (!link.ok()) return link.status();
  options.sft_sample_paths = {*link};
  if (options.inputs != nullptr) {
    // The run reads only held descriptors; the sample file is the daemon's own output, opened
    // now (a regular file only) under the name the engine gives it.
    absl::StatusOr<engine::InputFiles> clone = options.inputs->Clone();
    if (!clone.ok()) return clone.status();
    absl::StatusOr<engine::UniqueFd> fd = engine::OpenRegularFileForRead(samples->path);
    if (!fd.ok()) return fd.status();
    clone->Add(*link, *std::move(fd));
    held = *std::move(clone);
    options.inputs = &held;
  }
  return absl::OkStatus();
}

absl::StatusOr<JobTokens> DeviceJobEngine::TokenizeText(const std::string& job_id,
                                                        const service::ValidatedJob& job,
                                                        engine::TrainingObserver& observer) {
  // The runner hashed the data and the tokenizer into the lineage at the first run and checked
  // them before every later one; only after an allowed data change are they hashed again here.
  std::vector<provenance::InputFile> inputs;
  if (job.options.lineage.has_value() && job.options.lineage->data_changes.empty()) {
    inputs = job.options.lineage->inputs;
  } else {
    absl::StatusOr<std::vector<provenance::InputFile>> hashed = HashDataInputs(job);
    if (!hashed.ok()) return hashed.status();
    inputs = *std::move(hashed);
  }
  JobTokensRequest request;
  request.tokenize_binary =
      options_.tokenize_binary.empty() ? DefaultTokenizeBinary() : options_.tokenize_binary;
  request.tokenizer = job.options.tokenizer;
  request.text_paths = job.options.text_paths;
  request.inputs = job.options.inputs;
  request.tokens_dir = JobTokensDir(options_.state_dir, job_id, job);
  request.key = TokenFileKey(engine::kTokenizeOutputVersion, inputs);
  request.output_version = engine::kTokenizeOutputVersion;
  request.model_vocab_size = job.model.vocab_size;
  observer.OnLine(absl::StrCat("tokenizing with ", request.tokenizer, " into ", request.tokens_dir,
                               "/", request.key, " (reused when present)"),
                  true);
  absl::StatusOr<JobTokens> tokens =
      PrepareJobTokens(request, [&observer] { return observer.ShouldStop(); });
  if (!tokens.ok()) return tokens.status();
  observer.OnLine(
      absl::StrCat(tokens->reused ? "reusing token file " : "tokenized into ", tokens->path, ": ",
                   tokens->tokens, " tokens, vocab_size ", tokens->vocab_size),
      true);
  return tokens;
}

}  // namespace megatrain::server
