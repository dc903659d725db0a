// Checkpoint identity, resume and background writes of a training run (see run_checkpoints.h).
#include "engine/train/run_checkpoints.h"

#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/checkpoint/checkpoint_directory.h"
#include "engine/checkpoint/checkpoint_reader.h"
#include "engine/checkpoint/checkpoint_writer.h"
#include "engine/data/corpus_files.h"
#include "engine/device/device_options.h"
#include "engine/model/hf_companion_files.h"
#include "engine/model/hf_loader.h"
#include "engine/train/data_parallel_step.h"

namespace megatrain::engine {
namespace {

// Names the first top-level key whose value differs between two JSON objects.
std::string FirstDifferentKey(const std::string& a, const std::string& b) {
  const nlohmann::json ja = nlohmann::json::parse(a, nullptr, false);
  const nlohmann::json jb = nlohmann::json::parse(b, nullptr, false);
  if (!ja.is_object() || !jb.is_object()) return "(unparsable)";
  for (auto it = jb.begin(); it != jb.end(); ++it) {
    auto other = ja.find(it.key());
    if (other == ja.end() || *other != *it) {
      return absl::StrCat(it.key(), ": checkpoint has ",
                          other == ja.end() ? "nothing" : other->dump(), ", the job has ",
                          it->dump());
    }
  }
  for (auto it = ja.begin(); it != ja.end(); ++it) {
    if (!jb.contains(it.key())) return absl::StrCat(it.key(), ": not set by the job");
  }
  return "(none)";
}

// The files whose contents the run's tokens depend on: the corpus as training lists it (or the
// token files), and a SentencePiece model, which would silently change every token.
absl::StatusOr<std::vector<std::string>> DataAndTokenizerFiles(const TrainingRunOptions& options) {
  if (RunDataIsSamples(options)) return options.sft_sample_paths;
  if (!RunDataIsText(options)) return options.token_files;
  absl::StatusOr<std::vector<std::string>> files = ExpandCorpusFiles(options.text_paths);
  if (!files.ok()) return files.status();
  if (options.tokenizer != "bytes") files->push_back(options.tokenizer);
  return files;
}

// The lineage (given, or hashed now: base model, data, tokenizer), the origin of the run's
// first checkpoint and the signer.
absl::StatusOr<std::shared_ptr<const provenance::ProvenanceContext>> MakeProvenanceContext(
    const TrainingRunOptions& options, const std::string& job_json,
    const std::vector<std::string>& data_and_tokenizer_files) {
  auto context = std::make_shared<provenance::ProvenanceContext>();
  if (options.lineage.has_value()) {
    context->lineage = *options.lineage;
  } else {
    provenance::Lineage& l = context->lineage;
    l.job_spec_json = job_json;
    l.device_kind = std::string(DeviceKindName(options.device.kind));
    if (!options.init_from_hf_dir.empty()) {
      absl::StatusOr<std::vector<provenance::InputFile>> base =
          provenance::HashInputs(provenance::kRoleBaseModel, {options.init_from_hf_dir});
      if (!base.ok()) return base.status();
      l.inputs = *std::move(base);
    }
    for (const std::string& f : data_and_tokenizer_files) {
      const bool tokenizer = RunDataIsText(options) && f == options.tokenizer;
      absl::StatusOr<std::vector<provenance::InputFile>> hashed = provenance::HashInputs(
          tokenizer ? provenance::kRoleTokenizer : provenance::kRoleData, {f});
      if (!hashed.ok()) return hashed.status();
      l.inputs.insert(l.inputs.end(), hashed->begin(), hashed->end());
    }
  }
  context->origin =
      options.init_from_hf_dir.empty()
          ? provenance::RandomInitOrigin(options.seed)
          : provenance::BaseModelOrigin(options.init_from_hf_dir, context->lineage.inputs);
  context->signer = options.signer;
  return std::shared_ptr<const provenance::ProvenanceContext>(std::move(context));
}

}  // namespace

absl::StatusOr<SafetensorsDtype> RunCheckpointDtype(const TrainingRunOptions& options) {
  if (!options.checkpoint_dtype.empty()) {
    std::optional<SafetensorsDtype> wanted = ParseSafetensorsDtype(options.checkpoint_dtype);
    if (!wanted.has_value() ||
        (*wanted != SafetensorsDtype::kF32 && *wanted != SafetensorsDtype::kBF16 &&
         *wanted != SafetensorsDtype::kF16)) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint_dtype=", options.checkpoint_dtype, " must be F32, BF16 or F16"));
    }
    return *wanted;
  }
  if (options.init_from_hf_dir.empty()) return SafetensorsDtype::kF32;
  absl::StatusOr<SafetensorsDtype> source = HfWeightsDtype(options.init_from_hf_dir, options.inputs);
  if (!source.ok()) return source.status();
  // F64 sources and the like: fp32.
  return *source == SafetensorsDtype::kBF16 || *source == SafetensorsDtype::kF16
             ? *source
             : SafetensorsDtype::kF32;
}

absl::StatusOr<std::unique_ptr<RunCheckpoints>> RunCheckpoints::Create(
    const TrainingRunOptions& options, SafetensorsDtype model_dtype) {
  std::unique_ptr<RunCheckpoints> run(new RunCheckpoints(options, model_dtype));
  if (!run->enabled()) return run;
  absl::StatusOr<std::vector<std::string>> files = DataAndTokenizerFiles(options);
  if (!files.ok()) return files.status();
  absl::StatusOr<std::vector<DataFileRecord>> sums = ChecksumDataFiles(*files, options.inputs);
  if (!sums.ok()) return sums.status();
  run->data_files_ = *std::move(sums);
  absl::StatusOr<std::shared_ptr<const provenance::ProvenanceContext>> context =
      MakeProvenanceContext(options, run->job_json_, *files);
  if (!context.ok()) return context.status();
  run->provenance_ = *std::move(context);
  if (!options.init_from_hf_dir.empty()) {
    absl::StatusOr<std::vector<HfCompanionFile>> companions =
        ReadHfCompanionFiles(options.init_from_hf_dir, options.inputs);
    if (!companions.ok()) return companions.status();
    run->hf_companion_files_ =
        std::make_shared<const std::vector<HfCompanionFile>>(*std::move(companions));
  }
  return run;
}

absl::StatusOr<std::optional<ResumePoint>> RunCheckpoints::Resume(Trainer& trainer) {
  if (!enabled()) return std::nullopt;
  absl::StatusOr<std::optional<std::string>> latest = LatestCheckpoint(options_.checkpoint_dir);
  if (!latest.ok()) return latest.status();
  if (!options_.resume) {
    // A new run beside an earlier run's checkpoints would mix the two: retention keeps the
    // highest steps (the earlier run's) and deletes the new ones, and a later resume would
    // continue the earlier run.
    if (latest->has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint_dir '", options_.checkpoint_dir, "' holds checkpoints of an earlier run ",
          "(newest ", **latest, "): continue it with resume (train_local --resume), or give an "
          "empty or new checkpoint directory"));
    }
    return std::nullopt;
  }
  if (!latest->has_value()) return std::nullopt;
  const std::string& path = **latest;
  absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(path, trainer);
  if (!loaded.ok()) return loaded.status();
  if (absl::Status s = CheckDataFilesMatch(loaded->manifest.data_files, data_files_);
      !s.ok() && !options_.allow_changed_data_files) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": ", s.message()));
  }
  if (loaded->state.job_json != job_json_) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": the job differs from the checkpoint's: ",
                     FirstDifferentKey(loaded->state.job_json, job_json_)));
  }
  return ResumePoint{path, loaded->state.progress.step, loaded->state.data_cursor};
}

CheckpointRunInfo RunCheckpoints::RunInfo(uint64_t data_cursor) const {
  CheckpointRunInfo run;
  run.data_cursor = data_cursor;
  run.seed = options_.seed;
  run.job_json = job_json_;
  run.data_files = data_files_;
  run.provenance = provenance_;
  run.hf_companion_files = hf_companion_files_;
  return run;
}

CheckpointOptions RunCheckpoints::WriteOptions() const {
  CheckpointOptions checkpoint_options;
  checkpoint_options.keep_last = options_.keep_last;
  checkpoint_options.model_dtype = model_dtype_;
  return checkpoint_options;
}

absl::Status RunCheckpoints::Start(Trainer& trainer, uint64_t data_cursor,
                                   TrainingObserver& observer) {
  if (absl::Status s = Collect(observer); !s.ok()) return s;
  pending_step_ = trainer.steps_done();
  return writer_.Start(trainer, options_.checkpoint_dir, RunInfo(data_cursor), WriteOptions());
}

absl::Status RunCheckpoints::WriteSharded(Trainer& trainer, uint64_t data_cursor,
                                          dist::Communicator& comm, TrainingObserver& observer) {
  if (absl::Status s = Collect(observer); !s.ok()) return s;
  const ShardedCheckpointRanks ranks{
      comm.rank(), comm.size(),
      [&comm](const absl::Status& mine) { return AllRanksOk(comm, mine); }};
  absl::StatusOr<std::string> written = WriteShardedCheckpoint(
      trainer, options_.checkpoint_dir, RunInfo(data_cursor), WriteOptions(), ranks);
  if (!written.ok()) return written.status();
  last_checkpoint_ = *written;
  observer.OnCheckpoint(trainer.steps_done(), last_checkpoint_);
  return absl::OkStatus();
}

absl::Status RunCheckpoints::Collect(TrainingObserver& observer) {
  absl::StatusOr<std::optional<std::string>> written = writer_.Wait();
  if (!written.ok()) return written.status();
  if (written->has_value()) {
    last_checkpoint_ = **written;
    observer.OnCheckpoint(pending_step_, last_checkpoint_);
  }
  return absl::OkStatus();
}

}  // namespace megatrain::engine

