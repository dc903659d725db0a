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
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, "",
          "A checkpoint directory (manifest.json), a checkpoint root (its newest step-* is used) "
          "or a Hugging Face model directory (config.json + safetensors).");
ABSL_FLAG(std::string, tokenizer, "bytes", "bytes, or the SentencePiece .model used in training.");
ABSL_FLAG(std::string, prompt, "", "Text to continue; it starts a new document.");
ABSL_FLAG(int, tokens, 200, "Tokens to generate.");
ABSL_FLAG(double, temperature, 0.8, "Softmax temperature; 0 = greedy.");
ABSL_FLAG(double, top_p, 0.95, "Nucleus mass kept when sampling.");
ABSL_FLAG(uint64_t, seed, 1, "Sampling seed (same seed -> same text).");
ABSL_FLAG(int, context, 128,
          "Context window in tokens (capped at max_position_embeddings). With --chat, at least "
          "the rendered prompt plus --tokens (as far as max_position_embeddings allows), so the "
          "reply attends to the whole conversation as transformers' generate() does.");
ABSL_FLAG(bool, stop_at_end, true, "Stop at the end-of-document token.");
ABSL_FLAG(bool, chat, false,
          "Treat --prompt as a user turn (or take --conversation): render it with the model "
          "directory's chat template (tokenizer_config.json; a fine-tuning checkpoint carries "
          "it), generate the reply and print only the reply, decoded by the directory's "
          "tokenizer.json; generation stops where transformers' generate() stops: at "
          "generation_config.json's eos_token_id (else config.json's, else the tokenizer's eos "
          "token). --tokenizer is not used.");
ABSL_FLAG(std::string, conversation, "",
          "With --chat, instead of --prompt: the whole conversation to reply to, as JSON "
          "{\"messages\": [{\"role\": \"system\"|\"user\"|\"assistant\", \"content\": ...}, "
          "...]} (a chat JSONL line's shape), e.g. a system message, earlier turns and the user "
          "turn to answer.");
ABSL_FLAG(bool, json, false,
          "With --chat: print one JSON line {\"prompt_ids\", \"reply_ids\", \"text\"} (the "
          "rendered prompt, the generated ids with the stop token when one ended the reply, as "
          "generate() returns them, and the reply's text) instead of the text.");
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

absl::StatusOr<ChatPrompt> RenderChat(const std::string& tool, const std::string& model_dir) {
  const std::string conversation = absl::GetFlag(FLAGS_conversation);
  if (conversation.empty()) return RenderChatPrompt(tool, model_dir, absl::GetFlag(FLAGS_prompt));
  if (!absl::GetFlag(FLAGS_prompt).empty()) {
    return absl::InvalidArgumentError("give --prompt or --conversation, not both");
  }
  return RenderChatConversation(tool, model_dir, conversation, "--conversation");
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
  absl::StatusOr<ChatPrompt> prompt = RenderChat(tool, source.dir);
  if (!prompt.ok()) return prompt.status();
  // The window holds the prompt and the whole reply where the model allows it: a window that
  // slides would drop the conversation's start, which transformers' generate() never does.
  const int64_t whole =
      static_cast<int64_t>(prompt->ids.size()) + std::max(0, absl::GetFlag(FLAGS_tokens));
  const int window =
      static_cast<int>(std::max<int64_t>(context, std::min(whole, config.max_position_embeddings)));
  if (prompt->ids.size() >= static_cast<size_t>(window)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the rendered prompt has ", prompt->ids.size(),
                     " tokens, which leaves no room for a "
                     "reply in the model's max_position_embeddings=",
                     config.max_position_embeddings, " (--context=", absl::GetFlag(FLAGS_context),
                     ", --tokens=", absl::GetFlag(FLAGS_tokens), ")"));
  }
  absl::StatusOr<std::unique_ptr<Device>> device = CpuDevice();
  if (!device.ok()) return device.status();
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = LoadModel(**device, source, config, window);
  if (!trainer.ok()) return trainer.status();
  SamplingOptions sampling = SamplingFromFlags();
  if (absl::GetFlag(FLAGS_stop_at_end)) sampling.stop_tokens = prompt->stop_ids;
  Sampler sampler(**trainer, window);
  absl::StatusOr<std::vector<int32_t>> reply = sampler.Generate(prompt->ids, sampling);
  if (!reply.ok()) return reply.status();
  std::vector<int32_t> text_ids = *reply;
  if (!text_ids.empty() && std::find(prompt->stop_ids.begin(), prompt->stop_ids.end(),
                                     text_ids.back()) != prompt->stop_ids.end()) {
    text_ids.pop_back();
  }
  absl::StatusOr<std::string> text = DecodeChatIds(tool, source.dir, text_ids);
  if (!text.ok() || !absl::GetFlag(FLAGS_json)) return text;
  nlohmann::json out;
  out["prompt_ids"] = prompt->ids;
  out["reply_ids"] = *reply;
  out["text"] = *text;
  return out.dump();
}

absl::StatusOr<std::string> Run() {
  absl::StatusOr<ModelSource> source = ResolveModel(absl::GetFlag(FLAGS_model));
  if (!source.ok()) return source.status();
  absl::StatusOr<ModelConfig> config = LoadModelConfig(source->dir + "/config.json");
  if (!config.ok()) return config.status();
  const int context = static_cast<int>(
      std::min<int64_t>(absl::GetFlag(FLAGS_context), config->max_position_embeddings));
  if (absl::GetFlag(FLAGS_chat)) return RunChat(*source, *config, context);
  if (!absl::GetFlag(FLAGS_conversation).empty() || absl::GetFlag(FLAGS_json)) {
    return absl::InvalidArgumentError("--conversation and --json need --chat");
  }
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
      "--prompt='Hello' --temperature=0\n"
      "A conversation, as ids and text: sample --model=CKPT --chat --chat_tool=... --json "
      "--conversation='{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, "
      "{\"role\": \"user\", \"content\": \"Hello\"}]}' --temperature=0");
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<std::string> text = megatrain::engine::Run();
  if (!text.ok()) {
    fprintf(stderr, "error: %s\n", text.status().ToString().c_str());
    return 1;
  }
  printf("%s\n", text->c_str());
  return 0;
}
