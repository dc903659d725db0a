// Job-spec validation of fine-tuning data: data.chat_files (JSONL tokenized at run time with the
// model directory's HF tokenizer and chat template) or data.sample_files (pre-made MTSFT files),
// and the options train_on_prompt, pack, overlong and eval_prompts.
#pragma once

#include "absl/status/status.h"
#include "proto/megatrain.pb.h"
#include "service/path_policy.h"
#include "service/validated_job.h"

namespace megatrain::service {

// Whether the spec asks for fine-tuning data (chat_files or sample_files set).
bool IsSftData(const v1::DataSource& data);

// Fills job.chat_paths / chat_format or job.options.sft_sample_paths, and pack, train_on_prompt,
// overlong, and job.eval_prompts / eval_reply_tokens. Needs job.model and
// job.options.init_from_hf_dir. Errors name the field.
absl::Status ValidateSftData(const v1::DataSource& data, const PathPolicy& paths,
                             ValidatedJob& job);

// Refuses the fine-tuning options on a text or token-file job (they would be ignored).
absl::Status RefuseSftOptions(const v1::DataSource& data);

}  // namespace megatrain::service
