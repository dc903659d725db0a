// sample: generates text from a trained model (a megatrain checkpoint, a
// checkpoint root's newest checkpoint, or a Hugging Face model directory).
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

absl::StatusOr<std::string> Run() {
  absl::StatusOr<ModelSource> source = ResolveModel(absl::GetFlag(FLAGS_model));
  if (!source.ok()) return source.status();
  absl::StatusOr<ModelConfig> config = LoadModelConfig(source->dir + "/config.json");
  if (!config.ok()) return config.status();
  absl::StatusOr<std::unique_ptr<TextTokenizer>> tokenizer =
      CreateTextTokenizer(absl::GetFlag(FLAGS_tokenizer));
  if (!tokenizer.ok()) return tokenizer.status();
  if ((*tokenizer)->vocab_size() > config->vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer '", (*tokenizer)->name(), "' has ", (*tokenizer)->vocab_size(),
                     " tokens, more than the model's vocab_size=", config->vocab_size));
  }
  const int context = static_cast<int>(
      std::min<int64_t>(absl::GetFlag(FLAGS_context), config->max_position_embeddings));

  DeviceOptions device_options;
  device_options.kind = DeviceKind::kCpu;
  device_options.arena_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_arena_mb)) << 20;
  device_options.pinned_budget_bytes = size_t{64} << 30;
  absl::StatusOr<std::unique_ptr<Device>> device = CreateDevice(device_options);
  if (!device.ok()) return device.status();
  TrainerOptions options;
  options.micro_batch_size = 1;
  options.seq_len = context;
  options.blas_threads = absl::GetFlag(FLAGS_threads);
  options.collect_timeline = false;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(**device, *config, options);
  if (!trainer.ok()) return trainer.status();
  if (source->checkpoint) {
    absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(source->dir, **trainer);
    if (!loaded.ok()) return loaded.status();
  } else if (absl::Status s = (*trainer)->LoadHfWeights(source->dir); !s.ok()) {
    return s;
  }

  std::vector<int32_t> prompt = {(*tokenizer)->end_of_document()};
  if (absl::Status s = (*tokenizer)->Encode(absl::GetFlag(FLAGS_prompt), &prompt); !s.ok()) {
    return s;
  }
  SamplingOptions sampling;
  sampling.max_new_tokens = absl::GetFlag(FLAGS_tokens);
  sampling.temperature = absl::GetFlag(FLAGS_temperature);
  sampling.top_p = absl::GetFlag(FLAGS_top_p);
  sampling.seed = absl::GetFlag(FLAGS_seed);
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
      "Example: sample --model=/tmp/ckpt --prompt='Q: ' --tokens=200 --temperature=0.8");
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<std::string> text = megatrain::engine::Run();
  if (!text.ok()) {
    fprintf(stderr, "error: %s\n", text.status().ToString().c_str());
    return 1;
  }
  printf("%s\n", text->c_str());
  return 0;
}
