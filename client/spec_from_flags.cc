// The JobSpec from --spec and the flags (see spec_from_flags.h).
#include "client/spec_from_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "client/cli_flags.h"
#include "client/job_spec_file.h"

namespace megatrain::client {

absl::StatusOr<v1::JobSpec> SpecFromFlags() {
  v1::JobSpec spec;
  if (!absl::GetFlag(FLAGS_spec).empty()) {
    absl::StatusOr<v1::JobSpec> loaded = client::LoadJobSpecJson(absl::GetFlag(FLAGS_spec));
    if (!loaded.ok()) return loaded.status();
    spec = *loaded;
  }
  client::JobSpecOverrides o;
  if (!absl::GetFlag(FLAGS_name).empty()) o.name = absl::GetFlag(FLAGS_name);
  if (!absl::GetFlag(FLAGS_model_config).empty())
    o.model_config = absl::GetFlag(FLAGS_model_config);
  if (!absl::GetFlag(FLAGS_text).empty()) {
    o.text_files = absl::StrSplit(absl::GetFlag(FLAGS_text), ',', absl::SkipEmpty());
  }
  if (!absl::GetFlag(FLAGS_hf_directory).empty()) {
    o.hf_directory = absl::GetFlag(FLAGS_hf_directory);
  }
  if (!absl::GetFlag(FLAGS_chat).empty()) {
    o.chat_files = absl::StrSplit(absl::GetFlag(FLAGS_chat), ',', absl::SkipEmpty());
  }
  if (!absl::GetFlag(FLAGS_chat_format).empty()) o.chat_format = absl::GetFlag(FLAGS_chat_format);
  if (!absl::GetFlag(FLAGS_samples).empty()) {
    o.sample_files = absl::StrSplit(absl::GetFlag(FLAGS_samples), ',', absl::SkipEmpty());
  }
  o.train_on_prompt = absl::GetFlag(FLAGS_train_on_prompt);
  o.pack = absl::GetFlag(FLAGS_pack);
  if (!absl::GetFlag(FLAGS_overlong).empty()) o.overlong = absl::GetFlag(FLAGS_overlong);
  if (absl::GetFlag(FLAGS_steps) != 0) o.steps = absl::GetFlag(FLAGS_steps);
  if (absl::GetFlag(FLAGS_batch_size) != 0) o.batch_size = absl::GetFlag(FLAGS_batch_size);
  if (absl::GetFlag(FLAGS_micro_batch_size) != 0) {
    o.micro_batch_size = absl::GetFlag(FLAGS_micro_batch_size);
  }
  if (absl::GetFlag(FLAGS_seq_len) != 0) o.seq_len = absl::GetFlag(FLAGS_seq_len);
  if (absl::GetFlag(FLAGS_lr) != 0) o.lr = absl::GetFlag(FLAGS_lr);
  // Unset flags leave the spec alone; an explicit 0 overrides it (issue 21, point 6).
  o.warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
  o.eval_every_steps = absl::GetFlag(FLAGS_eval_every);
  if (!absl::GetFlag(FLAGS_output_dir).empty()) o.output_dir = absl::GetFlag(FLAGS_output_dir);
  o.seed = absl::GetFlag(FLAGS_seed);
  if (absl::GetFlag(FLAGS_devices) != 0) o.devices = absl::GetFlag(FLAGS_devices);
  o.speculative_update = absl::GetFlag(FLAGS_speculative_update);
  if (!absl::GetFlag(FLAGS_hosts).empty()) {
    o.hosts = absl::StrSplit(absl::GetFlag(FLAGS_hosts), ',', absl::SkipEmpty());
  }
  o.zero1 = absl::GetFlag(FLAGS_zero1);
  client::ApplyOverrides(o, spec);
  if (absl::GetFlag(FLAGS_reuse_output_dir)) spec.set_reuse_output_dir(true);
  return spec;
}

}  // namespace megatrain::client
