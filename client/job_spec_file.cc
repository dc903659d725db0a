// Job spec files and overrides (see job_spec_file.h).
#include "client/job_spec_file.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"

namespace megatrain::client {

absl::StatusOr<v1::JobSpec> ParseJobSpecJson(const std::string& json, const std::string& origin) {
  v1::JobSpec spec;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &spec, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": not a JobSpec: ", std::string(status.message())));
  }
  return spec;
}

absl::StatusOr<v1::JobSpec> LoadJobSpecJson(const std::string& path) {
  // Not engine::ReadRegularFile: the CLI reads what its own user names, and a pipe is a valid
  // spec (`--spec=<(...)`, tests/server:hardening_test).
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read job spec '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  return ParseJobSpecJson(text.str(), path);
}

void ApplyOverrides(const JobSpecOverrides& o, v1::JobSpec& spec) {
  if (o.name) spec.set_name(*o.name);
  if (o.model_config) spec.mutable_model()->set_config_json_path(*o.model_config);
  if (o.hf_directory) spec.mutable_model()->set_hf_directory(*o.hf_directory);
  v1::DataSource& data = *spec.mutable_data();
  if (o.text_files) {
    data.clear_text_files();
    for (const std::string& f : *o.text_files) data.add_text_files(f);
  }
  if (o.chat_files) {
    data.clear_chat_files();
    for (const std::string& f : *o.chat_files) data.add_chat_files(f);
  }
  if (o.chat_format) data.set_chat_format(*o.chat_format);
  if (o.sample_files) {
    data.clear_sample_files();
    for (const std::string& f : *o.sample_files) data.add_sample_files(f);
  }
  if (o.train_on_prompt) data.set_train_on_prompt(*o.train_on_prompt);
  if (o.pack) data.set_pack(*o.pack);
  if (o.overlong) data.set_overlong(*o.overlong);
  v1::Hyperparameters& h = *spec.mutable_hyper();
  if (o.steps) h.set_steps(*o.steps);
  if (o.batch_size) h.set_batch_size(*o.batch_size);
  if (o.micro_batch_size) h.set_micro_batch_size(*o.micro_batch_size);
  if (o.seq_len) h.set_seq_len(*o.seq_len);
  if (o.lr) h.mutable_lr()->set_peak_lr(*o.lr);
  if (o.warmup_steps) h.mutable_lr()->set_warmup_steps(*o.warmup_steps);
  if (o.eval_every_steps) spec.mutable_data()->set_eval_every_steps(*o.eval_every_steps);
  if (o.output_dir) spec.set_output_dir(*o.output_dir);
  if (o.seed) spec.set_seed(*o.seed);
  if (o.devices) spec.set_devices(*o.devices);
  if (o.speculative_update) spec.set_speculative_update(*o.speculative_update);
  if (o.hosts) {
    spec.clear_hosts();
    for (const std::string& h : *o.hosts) spec.add_hosts(h);
  }
  if (o.zero1) spec.set_zero1(*o.zero1);
}

}  // namespace megatrain::client
