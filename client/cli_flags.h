// The flags of the megatrain command line, declared for the files of the megatrain binary that
// read them. They are defined, with their help text, in megatrain_main.cc: absl's --help lists the
// flags of the binary's main file only, so they stay there.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/flags/declare.h"

ABSL_DECLARE_FLAG(std::string, socket);
ABSL_DECLARE_FLAG(std::string, address);
ABSL_DECLARE_FLAG(std::string, token_file);
ABSL_DECLARE_FLAG(std::string, ca_file);
ABSL_DECLARE_FLAG(bool, json);
ABSL_DECLARE_FLAG(int, timeout_seconds);
ABSL_DECLARE_FLAG(int, wait_seconds);
ABSL_DECLARE_FLAG(std::string, spec);
ABSL_DECLARE_FLAG(std::string, name);
ABSL_DECLARE_FLAG(std::string, model_config);
ABSL_DECLARE_FLAG(std::string, text);
ABSL_DECLARE_FLAG(std::string, hf_directory);
ABSL_DECLARE_FLAG(std::string, chat);
ABSL_DECLARE_FLAG(std::string, chat_format);
ABSL_DECLARE_FLAG(std::string, samples);
ABSL_DECLARE_FLAG(std::optional<bool>, train_on_prompt);
ABSL_DECLARE_FLAG(std::optional<bool>, pack);
ABSL_DECLARE_FLAG(std::string, overlong);
ABSL_DECLARE_FLAG(uint64_t, steps);
ABSL_DECLARE_FLAG(uint32_t, batch_size);
ABSL_DECLARE_FLAG(uint32_t, micro_batch_size);
ABSL_DECLARE_FLAG(uint32_t, seq_len);
ABSL_DECLARE_FLAG(double, lr);
ABSL_DECLARE_FLAG(std::optional<uint64_t>, warmup_steps);
ABSL_DECLARE_FLAG(std::optional<uint32_t>, eval_every);
ABSL_DECLARE_FLAG(std::string, output_dir);
ABSL_DECLARE_FLAG(std::optional<uint64_t>, seed);
ABSL_DECLARE_FLAG(double, older_than_days);
ABSL_DECLARE_FLAG(bool, reuse_output_dir);
ABSL_DECLARE_FLAG(bool, watch);
ABSL_DECLARE_FLAG(std::string, state);
ABSL_DECLARE_FLAG(double, interval_seconds);
ABSL_DECLARE_FLAG(int, iterations);
ABSL_DECLARE_FLAG(bool, offline);
ABSL_DECLARE_FLAG(bool, allow_data_change);
ABSL_DECLARE_FLAG(std::string, db);
ABSL_DECLARE_FLAG(double, nvme_rated_tbw);
ABSL_DECLARE_FLAG(double, nvme_wear_warn_share);
ABSL_DECLARE_FLAG(uint32_t, devices);
ABSL_DECLARE_FLAG(std::string, hosts);
ABSL_DECLARE_FLAG(std::optional<bool>, zero1);
ABSL_DECLARE_FLAG(std::optional<bool>, speculative_update);
ABSL_DECLARE_FLAG(bool, scaling);
ABSL_DECLARE_FLAG(std::string, hardware);
ABSL_DECLARE_FLAG(std::string, daemon_config);
