// Job-spec validation of `data`: token files opened and their ids checked against the model's
// vocabulary, or text files under the data roots with their tokenizer, and the validation split.
#pragma once

#include "absl/status/status.h"
#include "proto/megatrain.pb.h"
#include "service/path_policy.h"
#include "service/validated_job.h"

namespace megatrain::service {

// Fills job.options' data fields; needs job.model (its vocabulary) and job.options.init_from_hf_dir.
absl::Status ValidateData(const v1::DataSource& data, const PathPolicy& paths, ValidatedJob& job);

}  // namespace megatrain::service
