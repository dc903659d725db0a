// sample: generates text from a trained model (a megatrain checkpoint, a
// checkpoint root's newest checkpoint, or a Hugging Face model directory); with
// --chat, the reply to a user prompt through the model directory's HF tokenizer
// and chat template (the tools/hf_chat tool as a child process).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "engine/checkpoint/checkpoint_directory.h"
#include "engine/checkpoint/checkpoint_reader.h"
#include "engine/checkpoint/manifest.h"
#include "engine/data/text_tokenizer.h"
#include "engine/device/device_factory.h"
#include "engine/model/model_config.h"
#include "engine/train/sample_chat.h"
#include "engine/train/sampler.h"
#include "engine/train/trainer.h"

ABSL_FLAG(std::string, model, "",
          "A checkpoint directory (manifest.json), a checkpoint root (its newest step-* is used) "
          "or a Hugging Face model directory (config.json + safetensors).");
ABSL_FLAG(std::string, tokenizer, "bytes", "bytes, or the SentencePiece .model used in training.");
ABSL_FLAG(std::string, prompt, "", "Text to continue; it starts a new document.");
ABSL_FLAG(int, tokens, 200, "Tokens to generate.");
ABSL_FLAG(double, temperature, 0.8, "Softmax temperature; 0 = greedy.");
ABSL_FLAG(double, top_p, 0.95, "Nucleus mass kept when sampling.");
ABSL_FLAG(uint64_t, seed, 1, "Sampling seed (same seed -> same text).");
ABSL_FLAG(int, context, 128, "Context window in tokens (capped at max_position_embeddings).");
ABSL_FLAG(bool, stop_at_end, true, "Stop at the end-of-document token.");
ABSL_FLAG(bool, chat, false,
          "Treat --prompt as a user turn: render it with the model directory's chat template "
          "(tokenizer_config.json; a fine-tuning checkpoint carries it), generate the reply and "
          "print only the reply, decoded by the directory's tokenizer.json; generation stops at "
          "the template's eos / end-of-turn token. --tokenizer is not used.");
ABSL_FLAG(std::string, chat_tool, "",
          "With --chat: the HF chat tool, <checkout>/tools/hf_chat/megatrain_chat_tokenize "
          "(it needs scripts/setup's venv).");
ABSL_FLAG(int, arena_mb, 512, "Emulated device memory in MiB.");
ABSL_FLAG(int, threads, 2, "BLAS threads.");

namespace megatrain::engine {
namespace {

namespace fs = std::filesystem;

// Where the weights come from: a checkpoint (LoadCheckpoint) or an HF directory.
struct ModelSource {
  std::string dir;
  bool checkpoint = false;
};

absl::StatusOr<ModelSource> ResolveModel(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("--model is required");
  if (fs::exists(fs::path(path) / kManifestFileName)) return ModelSource{path, true};
  if (fs::exists(fs::path(path) / "config.json")) return ModelSource{path, false};
  absl::StatusOr<std::optional<std::string>> latest = LatestCheckpoint(path);
  if (!latest.ok()) return latest.status();
  if (!latest->has_value()) {
    return absl::NotFoundError(absl::StrCat(
        "--model=", path, " holds no manifest.json, config.json or step-* checkpoint"));
  }
  return ModelSource{**latest, true};
}

absl::StatusOr<std::unique_ptr<Trainer>> LoadModel(Device& device, const ModelSource& source,
                                                    const ModelConfig& config, int context) {
  TrainerOptions options;
  options.micro_batch_size = 1;
  options.seq_len = context;
  options.blas_threads = absl::GetFlag(FLAGS_threads);
  options.collect_timeline = false;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(device, config, options);
  if (!trainer.ok()) return trainer.status();
  if (source.checkpoint) {
    absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(source.dir, **trainer);
    if (!loaded.ok()) return loaded.status();
  } else if (absl::Status s = (*trainer)->LoadHfWeights(source.dir); !s.ok()) {
    return s;
  }
  return trainer;
}

absl::StatusOr<std::unique_ptr<Device>> CpuDevice() {
  DeviceOptions device_options;
  device_options.kind = DeviceKind::kCpu;
  device_options.arena_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_arena_mb)) << 20;
  device_options.pinned_budget_bytes = size_t{64} << 30;
  return CreateDevice(device_options);
}

SamplingOptions SamplingFromFlags() {
  SamplingOptions sampling;
  sampling.max_new_tokens = absl::GetFlag(FLAGS_tokens);
  sampling.temperature = absl::GetFlag(FLAGS_temperature);
  sampling.top_p = absl::GetFlag(FLAGS_top_p);
  sampling.seed = absl::GetFlag(FLAGS_seed);
  return sampling;
}

// --chat: the prompt rendered by the chat tool, the reply decoded by it (ids never leave the
// tool's tokenizer, so the text is what transformers' decode gives).
absl::StatusOr<std::string> RunChat(const ModelSource& source, const ModelConfig& config,
                                    int context) {
  const std::string tool = absl::GetFlag(FLAGS_chat_tool);
  if (tool.empty()) {
    return absl::InvalidArgumentError(
        "--chat needs --chat_tool=<checkout>/tools/hf_chat/megatrain_chat_tokenize");
  }
  absl::StatusOr<ChatPrompt> prompt =
      RenderChatPrompt(tool, source.dir, absl::GetFlag(FLAGS_prompt));
  if (!prompt.ok()) return prompt.status();
  if (prompt->ids.size() >= static_cast<size_t>(context)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the rendered prompt has ", prompt->ids.size(), " tokens, not fewer than --context=",
        context, ": raise --context (up to max_position_embeddings=",
        config.max_position_embeddings, ")"));
  }
  absl::StatusOr<std::unique_ptr<Device>> device = CpuDevice();
  if (!device.ok()) return device.status();
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = LoadModel(**device, source, config, context);
  if (!trainer.ok()) return trainer.status();
  SamplingOptions sampling = SamplingFromFlags();
  if (absl::GetFlag(FLAGS_stop_at_end)) sampling.stop_tokens = prompt->stop_ids;
  Sampler sampler(**trainer, context);
  absl::StatusOr<std::vector<int32_t>> reply = sampler.Generate(prompt->ids, sampling);
  if (!reply.ok()) return reply.status();
  if (!reply->empty() && std::find(prompt->stop_ids.begin(), prompt->stop_ids.end(),
                                   reply->back()) != prompt->stop_ids.end()) {
    reply->pop_back();
  }
  return DecodeChatIds(tool, source.dir, *reply);
}

absl::StatusOr<std::string> Run() {
  absl::StatusOr<ModelSource> source = ResolveModel(absl::GetFlag(FLAGS_model));
  if (!source.ok()) return source.status();
  absl::StatusOr<ModelConfig> config = LoadModelConfig(source->dir + "/config.json");
  if (!config.ok()) return config.status();
  const int context = static_cast<int>(
      std::min<int64_t>(absl::GetFlag(FLAGS_context), config->max_position_embeddings));
  if (absl::GetFlag(FLAGS_chat)) return RunChat(*source, *config, context);
  absl::StatusOr<std::unique_ptr<TextTokenizer>> tokenizer =
      CreateTextTokenizer(absl::GetFlag(FLAGS_tokenizer));
  if (!tokenizer.ok()) return tokenizer.status();
  if ((*tokenizer)->vocab_size() > config->vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer '", (*tokenizer)->name(), "' has ", (*tokenizer)->vocab_size(),
                     " tokens, more than the model's vocab_size=", config->vocab_size));
  }

  absl::StatusOr<std::unique_ptr<Device>> device = CpuDevice();
  if (!device.ok()) return device.status();
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = LoadModel(**device, *source, *config, context);
  if (!trainer.ok()) return trainer.status();

  std::vector<int32_t> prompt = {(*tokenizer)->end_of_document()};
  if (absl::Status s = (*tokenizer)->Encode(absl::GetFlag(FLAGS_prompt), &prompt); !s.ok()) {
    return s;
  }
  SamplingOptions sampling = SamplingFromFlags();
  sampling.vocab_limit = (*tokenizer)->vocab_size();
  if (absl::GetFlag(FLAGS_stop_at_end)) sampling.stop_token = (*tokenizer)->end_of_document();
  Sampler sampler(**trainer, context);
  absl::StatusOr<std::vector<int32_t>> generated = sampler.Generate(prompt, sampling);
  if (!generated.ok()) return generated.status();
  if (!generated->empty() && generated->back() == (*tokenizer)->end_of_document()) {
    generated->pop_back();
  }
  std::vector<int32_t> text(prompt.begin() + 1, prompt.end());
  text.insert(text.end(), generated->begin(), generated->end());
  return (*tokenizer)->Decode(text);
}

}  // namespace
}  // namespace megatrain::engine

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Generates text from a trained model on the CPU device.\n"
      "Example: sample --model=/tmp/ckpt --prompt='Q: ' --tokens=200 --temperature=0.8\n"
      "Chat: sample --model=CKPT --chat --chat_tool=tools/hf_chat/megatrain_chat_tokenize "
      "--prompt='Hello' --temperature=0");
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<std::string> text = megatrain::engine::Run();
  if (!text.ok()) {
    fprintf(stderr, "error: %s\n", text.status().ToString().c_str());
    return 1;
  }
  printf("%s\n", text->c_str());
  return 0;
}
