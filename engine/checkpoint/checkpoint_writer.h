// WriteCheckpoint: saves a trainer's model (Hugging Face layout), optimizer
// state and training position as one crash-safe checkpoint directory.
//
// Commit protocol (a crash at any point leaves the previous checkpoints
// intact and either no new one or a complete new one):
//   1. Wait for the trainer's in-flight AdamW update; from here until the
//      function returns the caller must not step the trainer (the buffers are
//      read in place, never copied whole) — unless the write runs from a
//      Trainer snapshot (WriteCheckpointSnapshot, AsyncCheckpointWriter), in
//      which case the trainer keeps stepping and its optimizer updates of an
//      entry wait until the entry is written.
//   2. Remove leftovers of interrupted writers (".tmp-*", ".trash-*") in the
//      root; one writer per root at a time is assumed.
//   3. Create root/.tmp-step-N and write into it, each file streamed tensor by
//      tensor from the parameter store (at most one tensor is converted at a
//      time, for bf16/fp16 export) while its CRC32C is computed, and fsynced:
//      config.json; model.safetensors, or model-0000K-of-0000M.safetensors
//      and model.safetensors.index.json when sharded; optimizer.safetensors
//      (AdamW m and v, plus the fp32 master when the model is not fp32);
//      trainer_state.json.
//   4. Write manifest.json (sizes and CRC32C of every file, the data
//      files' checksums, the build) and fsync it; then provenance.json (the
//      SHA-256 of every file including the manifest, and of every tensor of
//      the safetensors files, all computed while the files were streamed; the
//      lineage; the link to the previous record; engine/provenance/record.h)
//      and, with a signer, provenance.sig; both fsynced.
//   5. fsync the temporary directory, so all names in it are durable.
//   6. Rename it to root/step-N (the commit point). If step-N already exists,
//      the two are swapped atomically (renameat2 RENAME_EXCHANGE) and the old
//      one, now under the temporary name, is removed.
//   7. fsync the root, so the rename is durable.
//   8. Retention: delete all but the newest keep_last checkpoints (each one's
//      provenance record copied to root/lineage, then renamed to ".trash-*"
//      before removal; see checkpoint_directory.h).
// Readers only ever open "step-*" directories and verify their manifest.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/checkpoint/checkpointable.h"
#include "engine/checkpoint/manifest.h"
#include "engine/model/hf_companion_files.h"
#include "engine/model/safetensors_dtype.h"
#include "engine/provenance/record.h"

namespace megatrain::engine {

inline constexpr char kOptimizerFileName[] = "optimizer.safetensors";

struct CheckpointOptions {
  // dtype of the model files: kF32 (then they are the fp32 master, stored
  // once), kBF16 or kF16 (the master then goes to optimizer.safetensors).
  SafetensorsDtype model_dtype = SafetensorsDtype::kF32;
  // Largest model shard in bytes; 0 = one model.safetensors. A tensor larger
  // than the limit gets a shard of its own.
  uint64_t max_shard_bytes = 0;
  int keep_last = 0;  // checkpoints kept after this one is committed; 0 = all
  // false: no SHA-256 and no provenance record. Only for measuring what the
  // record costs (bench); every checkpoint of a run carries one.
  bool record_provenance = true;
};

// What the trainer does not know about the run.
struct CheckpointRunInfo {
  uint64_t data_cursor = 0;
  uint64_t seed = 0;
  std::string job_json = "{}";
  std::vector<DataFileRecord> data_files;
  // Lineage, the run's origin and the signer for provenance.json; null = a
  // record with only the job and the build, unsigned.
  std::shared_ptr<const provenance::ProvenanceContext> provenance;
  // The tokenizer, chat template and generation config of the HF model the run started from
  // (hf_companion_files.h), written beside config.json in every checkpoint and listed in its
  // manifest, so a checkpoint loads in transformers with its tokenizer; null or empty = none.
  std::shared_ptr<const std::vector<HfCompanionFile>> hf_companion_files;
};

// Waits for the trainer's updates: OK when they succeeded, else the failure, saying the store is
// not checkpointed (every writer below checks it first: a failed update leaves a store whose
// progress counts an update it holds only in part).
absl::Status CheckUpdatesSucceeded(Checkpointable& trainer);

// Writes the checkpoint of the trainer's current step under `root` (created
// if needed) and returns its path.
absl::StatusOr<std::string> WriteCheckpoint(Checkpointable& trainer, const std::string& root,
                                            const CheckpointRunInfo& run,
                                            const CheckpointOptions& options = {});

// The same from a snapshot (Trainer::BeginSnapshot) taken at `progress`, for
// writing while training continues: reads the parameter store without waiting
// for updates, and calls entry_written(e) (if set) once entry e's master, m
// and v are in the files, in entry order.
absl::StatusOr<std::string> WriteCheckpointSnapshot(Checkpointable& trainer,
                                                    const TrainerProgress& progress,
                                                    const std::string& root,
                                                    const CheckpointRunInfo& run,
                                                    const CheckpointOptions& options,
                                                    const std::function<void(int)>& entry_written);

// ZeRO-1 shard checkpoints (docs/scale_out.md). Each rank writes the optimizer state (m, v, and
// the master when the model is not F32) of the elements its store holds
// (ParameterStore::optimizer_state_range), a tensor its range cuts as that piece
// (OptimizerPieceName), as OptimizerShardFileName(rank, world); rank 0 writes the
// model, trainer_state.json and the one manifest.json (and provenance record) listing every
// shard, and commits the directory as WriteCheckpoint does. LoadCheckpoint reads it on any world
// size. Every rank calls it at the same step with the same arguments.
struct ShardedCheckpointRanks {
  int rank = 0;
  int world = 1;
  // A collective every rank calls at the same points with its own status: OK on every rank when
  // every rank's was OK, else (on every rank) an error naming a rank that failed.
  std::function<absl::Status(const absl::Status&)> all_ok;
};
std::string OptimizerShardFileName(int rank, int world);
// A shard's part of an optimizer tensor (`m.<hf_name>` ...): elements [begin, end) of the
// flattened tensor, one-dimensional, named `m.<hf_name>[begin:end]`. Parse returns false for a
// name not of that form (a whole tensor's).
std::string OptimizerPieceName(const std::string& name, size_t begin, size_t end);
bool ParseOptimizerPieceName(const std::string& piece, std::string* name, size_t* begin,
                             size_t* end);
absl::StatusOr<std::string> WriteShardedCheckpoint(Checkpointable& trainer, const std::string& root,
                                                   const CheckpointRunInfo& run,
                                                   const CheckpointOptions& options,
                                                   const ShardedCheckpointRanks& ranks);

// Writes only the Hugging Face model (config.json and model weights, and the companion files
// given: tokenizer, chat template, generation config) into `dir`, which must not exist; created
// through a temporary name and renamed.
absl::Status ExportHfModel(Checkpointable& trainer, const std::string& dir,
                           SafetensorsDtype dtype = SafetensorsDtype::kF32,
                           uint64_t max_shard_bytes = 0,
                           const std::vector<HfCompanionFile>& companions = {});

}  // namespace megatrain::engine
