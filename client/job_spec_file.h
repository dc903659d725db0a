// Job specs for the CLI: a JobSpec from a JSON file (proto3 JSON mapping, snake_case or
// camelCase names) with command-line overrides applied on top.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/megatrain.pb.h"

namespace megatrain::client {

// Unknown JSON fields are INVALID_ARGUMENT naming the file.
absl::StatusOr<v1::JobSpec> LoadJobSpecJson(const std::string& path);
absl::StatusOr<v1::JobSpec> ParseJobSpecJson(const std::string& json, const std::string& origin);

// Fields a flag may override; unset = keep the file's value.
struct JobSpecOverrides {
  std::optional<std::string> name;
  std::optional<std::string> model_config;  // config_json_path ("builtin:tiny" allowed)
  std::optional<std::string> hf_directory;  // model.hf_directory
  std::optional<std::vector<std::string>> text_files;
  // Fine-tuning data (docs/fine_tuning.md): chat / instruction JSONL or pre-made MTSFT files.
  std::optional<std::vector<std::string>> chat_files;
  std::optional<std::string> chat_format;
  std::optional<std::vector<std::string>> sample_files;
  std::optional<bool> train_on_prompt;
  std::optional<bool> pack;
  std::optional<std::string> overlong;
  std::optional<uint64_t> steps;
  std::optional<uint32_t> batch_size;
  std::optional<uint32_t> micro_batch_size;
  std::optional<uint32_t> seq_len;
  std::optional<double> lr;
  std::optional<uint64_t> warmup_steps;
  std::optional<uint32_t> eval_every_steps;
  std::optional<std::string> output_dir;
  std::optional<uint64_t> seed;
  std::optional<uint32_t> devices;  // JobSpec.devices (data parallel)
  std::optional<bool> speculative_update;  // JobSpec.speculative_update
  std::optional<std::vector<std::string>> hosts;  // JobSpec.hosts (replaces the spec's)
  std::optional<bool> zero1;                      // JobSpec.zero1
};

void ApplyOverrides(const JobSpecOverrides& overrides, v1::JobSpec& spec);

}  // namespace megatrain::client
