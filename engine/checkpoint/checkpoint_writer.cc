// Checkpoint and Hugging Face export writer (protocol in checkpoint_writer.h).
#include "engine/checkpoint/checkpoint_writer.h"

#include <fcntl.h>
#include <stdio.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/checkpoint/checkpoint_directory.h"
#include "engine/checkpoint/durable_file.h"
#include "engine/checkpoint/provenance_writer.h"
#include "engine/checkpoint/safetensors_stream_writer.h"
#include "engine/checkpoint/training_state.h"
#include "engine/common/build_version.h"

namespace megatrain::engine {
namespace {

namespace fs = std::filesystem;

const std::map<std::string, std::string> kPtMetadata = {{"format", "pt"}};

struct TensorRef {
  const TensorSlot* slot = nullptr;
  int entry = -1;
};

std::vector<TensorRef> AllTensors(const ParameterLayout& layout) {
  std::vector<TensorRef> out;
  for (int e = 0; e < layout.num_entries(); ++e) {
    for (const TensorSlot& slot : layout.entries()[e].tensors) out.push_back({&slot, e});
  }
  return out;
}

std::string TorchDtypeName(SafetensorsDtype dtype) {
  switch (dtype) {
    case SafetensorsDtype::kBF16:
      return "bfloat16";
    case SafetensorsDtype::kF16:
      return "float16";
    default:
      return "float32";
  }
}

absl::Status CheckModelDtype(SafetensorsDtype dtype) {
  if (dtype == SafetensorsDtype::kF32 || dtype == SafetensorsDtype::kBF16 ||
      dtype == SafetensorsDtype::kF16) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "model dtype ", std::string(SafetensorsDtypeName(dtype)), " is not F32, BF16 or F16"));
}

// Appends `values` to `writer` in `dtype`, converting one tensor at a time.
absl::Status AppendConverted(SafetensorsStreamWriter& writer, absl::Span<const float> values,
                             SafetensorsDtype dtype) {
  switch (dtype) {
    case SafetensorsDtype::kF32:
      return writer.Append(values);
    case SafetensorsDtype::kBF16:
      return writer.Append(absl::MakeConstSpan(EncodeBf16(values)));
    case SafetensorsDtype::kF16:
      return writer.Append(absl::MakeConstSpan(EncodeF16(values)));
    default:
      return CheckModelDtype(dtype);
  }
}

// One entry's fp32 master at a time, wherever it lives: in RAM directly, on
// the NVMe tier through one entry's worth of RAM.
class MasterReader {
 public:
  explicit MasterReader(ParameterStore& store) : store_(store) {}
  absl::StatusOr<const float*> Entry(int entry) {
    const EntryBuffers b = store_.entry(entry);
    if (b.master != nullptr) return b.master;
    if (entry != staged_entry_) {
      staged_.resize(b.elements);
      staged_entry_ = -1;
      if (absl::Status s = store_.ReadMaster(entry, staged_.data()); !s.ok()) return s;
      staged_entry_ = entry;
    }
    return staged_.data();
  }

 private:
  ParameterStore& store_;
  int staged_entry_ = -1;
  std::vector<float> staged_;
};

// What was written into a checkpoint directory: manifest records and, when
// the provenance record is wanted, SHA-256 digests computed while streaming.
struct WrittenFiles {
  bool with_digests = false;
  std::vector<ManifestFileRecord> records;
  std::vector<provenance::FileDigest> digests;
};

absl::Status WriteText(const std::string& dir, const std::string& name, const std::string& text,
                       WrittenFiles* written) {
  absl::StatusOr<FileChecksum> sum = WriteDurableFile(absl::StrCat(dir, "/", name), text);
  if (!sum.ok()) return sum.status();
  written->records.push_back({name, *sum});
  if (written->with_digests) {
    written->digests.push_back({name, sum->bytes, provenance::Sha256Hex(text), {}});
  }
  return absl::OkStatus();
}

void AddStreamed(const SafetensorsStreamWriter& writer, const std::string& name,
                 WrittenFiles* written) {
  written->records.push_back({name, writer.checksum()});
  if (written->with_digests) written->digests.push_back(writer.digest());
}

// config.json and the model weights, fsynced, into the existing `dir`.
absl::Status WriteModelFiles(Checkpointable& trainer, const std::string& dir,
                             SafetensorsDtype dtype, uint64_t max_shard_bytes,
                             WrittenFiles* records) {
  if (absl::Status s = CheckModelDtype(dtype); !s.ok()) return s;
  nlohmann::ordered_json config = nlohmann::ordered_json::parse(trainer.config().ToJson());
  config["torch_dtype"] = TorchDtypeName(dtype);
  if (absl::Status s = WriteText(dir, "config.json", config.dump(2) + "\n", records); !s.ok()) {
    return s;
  }

  const std::vector<TensorRef> tensors = AllTensors(trainer.layout());
  const uint64_t item = SafetensorsDtypeSize(dtype);
  // Shards in layout order, each up to max_shard_bytes.
  std::vector<std::vector<TensorRef>> shards(1);
  uint64_t shard_bytes = 0, total_bytes = 0;
  for (const TensorRef& t : tensors) {
    const uint64_t bytes = t.slot->num_elements() * item;
    if (max_shard_bytes > 0 && !shards.back().empty() && shard_bytes + bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(t);
    shard_bytes += bytes;
    total_bytes += bytes;
  }
  const bool sharded = shards.size() > 1;
  MasterReader masters(trainer.mutable_store());
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string name =
        sharded ? absl::StrFormat("model-%05d-of-%05d.safetensors", k + 1, shards.size())
                : std::string("model.safetensors");
    std::vector<SafetensorsEntry> entries;
    for (const TensorRef& t : shards[k]) {
      entries.push_back({t.slot->hf_name, dtype, t.slot->shape});
      weight_map[t.slot->hf_name] = name;
    }
    absl::StatusOr<SafetensorsStreamWriter> writer = SafetensorsStreamWriter::Create(
        absl::StrCat(dir, "/", name), entries, kPtMetadata, records->with_digests);
    if (!writer.ok()) return writer.status();
    for (const TensorRef& t : shards[k]) {
      absl::StatusOr<const float*> master = masters.Entry(t.entry);
      if (!master.ok()) return master.status();
      const float* p = *master + t.slot->offset;
      if (absl::Status s =
              AppendConverted(*writer, absl::MakeConstSpan(p, t.slot->num_elements()), dtype);
          !s.ok()) {
        return s;
      }
    }
    if (absl::Status s = writer->Finish(); !s.ok()) return s;
    AddStreamed(*writer, name, records);
  }
  if (sharded) {
    nlohmann::ordered_json index = {{"metadata", {{"total_size", total_bytes}}},
                                    {"weight_map", std::move(weight_map)}};
    if (absl::Status s =
            WriteText(dir, "model.safetensors.index.json", index.dump(2) + "\n", records);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status WriteCompanionFiles(const std::string& dir, const std::vector<HfCompanionFile>& files,
                                 WrittenFiles* written) {
  for (const HfCompanionFile& f : files) {
    if (absl::Status s = WriteText(dir, f.name, f.bytes, written); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// The optimizer state as `file_name`: every entry's, or with `own_state_only` the part this store
// holds (a ZeRO-1 rank's shard: ParameterStore::optimizer_state_range), a tensor the range cuts
// written as its piece (OptimizerPieceName).
absl::Status WriteOptimizerFile(Checkpointable& trainer, const std::string& dir,
                                const std::string& file_name, bool own_state_only, bool with_master,
                                WrittenFiles* records,
                                const std::function<void(int)>& entry_written) {
  // A tensor's elements [begin, end) (relative to the tensor), all of it unless own_state_only.
  struct Piece {
    TensorRef t;
    size_t begin = 0;
    size_t end = 0;
    bool whole() const { return begin == 0 && end == t.slot->num_elements(); }
  };
  std::vector<Piece> pieces;
  for (const TensorRef& t : AllTensors(trainer.layout())) {
    const size_t n = t.slot->num_elements();
    if (!own_state_only) {
      pieces.push_back({t, 0, n});
      continue;
    }
    const ElementRange range = trainer.store().optimizer_state_range(t.entry);
    const size_t begin = std::max(range.first, t.slot->offset);
    const size_t end = std::min(range.end(), t.slot->offset + n);
    if (begin < end) pieces.push_back({t, begin - t.slot->offset, end - t.slot->offset});
  }
  std::vector<SafetensorsEntry> entries;
  for (const Piece& p : pieces) {
    const std::vector<int64_t> shape =
        p.whole() ? p.t.slot->shape : std::vector<int64_t>{static_cast<int64_t>(p.end - p.begin)};
    for (const char* kind : {"master.", "m.", "v."}) {
      if (!with_master && std::string_view(kind) == "master.") continue;
      const std::string name = kind + p.t.slot->hf_name;
      entries.push_back({p.whole() ? name : OptimizerPieceName(name, p.begin, p.end),
                         SafetensorsDtype::kF32, shape});
    }
  }
  absl::StatusOr<SafetensorsStreamWriter> writer =
      SafetensorsStreamWriter::Create(absl::StrCat(dir, "/", file_name), std::move(entries),
                                      {{"format", "megatrain"}}, records->with_digests);
  if (!writer.ok()) return writer.status();
  // m and v come through the store one entry at a time, wherever they live
  // (RAM, or the NVMe tier), so RAM never holds more than one entry's copy.
  ParameterStore& store = trainer.mutable_store();
  MasterReader masters(store);
  int staged_entry = -1;
  ElementRange staged_range;
  std::vector<float> m, v;
  const float* master = nullptr;
  for (const Piece& p : pieces) {
    const TensorRef& t = p.t;
    if (t.entry != staged_entry) {
      // The previous entry's master, m and v are all in the files now.
      if (staged_entry >= 0 && entry_written) entry_written(staged_entry);
      staged_range = store.optimizer_state_range(t.entry);
      m.resize(staged_range.count);
      v.resize(staged_range.count);
      if (absl::Status s = store.ReadOptimizerState(t.entry, m.data(), v.data()); !s.ok()) {
        return s;
      }
      if (with_master) {
        absl::StatusOr<const float*> entry_master = masters.Entry(t.entry);
        if (!entry_master.ok()) return entry_master.status();
        master = *entry_master;
      }
      staged_entry = t.entry;
    }
    // Element offsets in the entry, and in the staged range's m and v.
    const size_t first = t.slot->offset + p.begin;
    const size_t n = p.end - p.begin;
    const float* const arrays[] = {with_master ? master + first : nullptr,
                                   m.data() + (first - staged_range.first),
                                   v.data() + (first - staged_range.first)};
    for (const float* base : arrays) {
      if (base == nullptr) continue;
      if (absl::Status s = writer->Append(absl::MakeConstSpan(base, n)); !s.ok()) return s;
    }
  }
  if (staged_entry >= 0 && entry_written) entry_written(staged_entry);
  if (absl::Status s = writer->Finish(); !s.ok()) return s;
  AddStreamed(*writer, file_name, records);
  return absl::OkStatus();
}

// A ZeRO-1 rank's shard record (its manifest record and digests) for rank 0, which writes the
// one manifest and provenance record: written beside the shard, read and removed by rank 0.
std::string ShardSidecarName(int rank) { return absl::StrCat(".shard-", rank, ".json"); }

absl::Status WriteShardSidecar(const std::string& dir, int rank, const WrittenFiles& shard) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  const ManifestFileRecord& r = shard.records.front();
  j["name"] = r.name;
  j["bytes"] = r.checksum.bytes;
  j["crc32c"] = r.checksum.crc32c;
  if (shard.with_digests) {
    const provenance::FileDigest& d = shard.digests.front();
    j["sha256"] = d.sha256_hex;
    nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
    for (const provenance::TensorDigest& t : d.tensors) {
      tensors.push_back({t.name, t.begin, t.end, t.sha256_hex});
    }
    j["tensors"] = std::move(tensors);
  }
  absl::StatusOr<FileChecksum> sum =
      WriteDurableFile(absl::StrCat(dir, "/", ShardSidecarName(rank)), j.dump());
  return sum.ok() ? absl::OkStatus() : sum.status();
}

// Rank 0: every shard's record and digests into `written`, the sidecars removed.
absl::Status CollectShards(const std::string& dir, int world, WrittenFiles* written) {
  for (int rank = 0; rank < world; ++rank) {
    const std::string path = absl::StrCat(dir, "/", ShardSidecarName(rank));
    std::ifstream in(path);
    nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("name")) {
      return absl::DataLossError(absl::StrCat(path, ": not a shard record"));
    }
    ManifestFileRecord record;
    // A field of the wrong type (a damaged or foreign sidecar) is an error of the checkpoint,
    // never an exception out of the writer.
    try {
      record.name = j.at("name").get<std::string>();
      record.checksum.bytes = j.at("bytes").get<uint64_t>();
      record.checksum.crc32c = j.at("crc32c").get<uint32_t>();
    } catch (const nlohmann::json::exception& e) {
      return absl::DataLossError(absl::StrCat(path, ": not a shard record: ", e.what()));
    }
    if (record.name != OptimizerShardFileName(rank, world)) {
      return absl::DataLossError(absl::StrCat(path, ": names ", record.name, ", expected ",
                                              OptimizerShardFileName(rank, world)));
    }
    written->records.push_back(record);
    if (written->with_digests) {
      if (!j.contains("sha256") || !j.contains("tensors")) {
        return absl::DataLossError(absl::StrCat(path, ": no digests"));
      }
      try {
        provenance::FileDigest d{
            record.name, record.checksum.bytes, j.at("sha256").get<std::string>(), {}};
        for (const nlohmann::json& t : j.at("tensors")) {
          d.tensors.push_back({t.at(0).get<std::string>(), t.at(1).get<uint64_t>(),
                               t.at(2).get<uint64_t>(), t.at(3).get<std::string>()});
        }
        written->digests.push_back(std::move(d));
      } catch (const nlohmann::json::exception& e) {
        return absl::DataLossError(absl::StrCat(path, ": damaged digests: ", e.what()));
      }
    }
    std::error_code ec;
    fs::remove(path, ec);
    if (ec) return absl::InternalError(absl::StrCat(path, ": cannot remove: ", ec.message()));
  }
  return absl::OkStatus();
}

absl::Status MakeDirectory(const std::string& path) {
  std::error_code ec;
  if (!fs::create_directory(path, ec) || ec) {
    return absl::InternalError(
        absl::StrCat(path, ": cannot create directory: ", ec ? ec.message() : "already exists"));
  }
  return absl::OkStatus();
}

// Replaces the checkpoint at `final_path` (the same step, written again) by `tmp` where the
// filesystem cannot exchange the two atomically (NFS refuses renameat2's flags): the old one
// moves to `tmp`'s leftover name, then `tmp` takes its place. A crash between the two renames
// leaves that step's checkpoint only as a leftover (removed by the next write) and resumes from
// the one before it.
absl::Status ReplaceWithoutExchange(const std::string& tmp, const std::string& final_path) {
  const std::string old = tmp + ".replaced";
  std::error_code ec;
  fs::remove_all(old, ec);
  if (::rename(final_path.c_str(), old.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("rename ", final_path, " -> ", old, ": ", std::strerror(errno)));
  }
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    const int err = errno;
    (void)::rename(old.c_str(), final_path.c_str());  // the step's earlier checkpoint goes back
    return absl::InternalError(
        absl::StrCat("rename ", tmp, " -> ", final_path, ": ", std::strerror(err)));
  }
  if (::rename(old.c_str(), tmp.c_str()) != 0) fs::remove_all(old, ec);
  return absl::OkStatus();
}

// Steps 6 and 7 of the protocol.
absl::Status CommitDirectory(const std::string& tmp, const std::string& final_path,
                             const std::string& parent) {
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_NOREPLACE) != 0) {
    const int err = errno;
    std::error_code ec;
    if (err == EINVAL && !fs::exists(fs::symlink_status(final_path, ec))) {
      // No RENAME_NOREPLACE here (NFS): one writer commits a root's checkpoints, and the name
      // is free.
      if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
        return absl::InternalError(
            absl::StrCat("rename ", tmp, " -> ", final_path, ": ", std::strerror(errno)));
      }
      return FsyncDirectory(parent);
    }
    if (err != EEXIST && err != EINVAL) {
      return absl::InternalError(
          absl::StrCat("rename ", tmp, " -> ", final_path, ": ", std::strerror(err)));
    }
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE) != 0) {
      if (errno != EINVAL) {
        return absl::InternalError(
            absl::StrCat("exchange ", tmp, " <-> ", final_path, ": ", std::strerror(errno)));
      }
      if (absl::Status s = ReplaceWithoutExchange(tmp, final_path); !s.ok()) return s;
    }
    // Durable first; the replaced checkpoint (now under tmp's leftover name) goes after, and
    // failing to remove it only leaves a leftover the next write removes.
    if (absl::Status s = FsyncDirectory(parent); !s.ok()) return s;
    fs::remove_all(tmp, ec);
    return absl::OkStatus();
  }
  return FsyncDirectory(parent);
}

}  // namespace

absl::Status CheckUpdatesSucceeded(Checkpointable& trainer) {
  if (absl::Status s = trainer.UpdateStatus(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("not checkpointed: the optimizer update before it "
                                               "failed, so the store is not one step's: ",
                                               s.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> WriteCheckpoint(Checkpointable& trainer, const std::string& root,
                                            const CheckpointRunInfo& run,
                                            const CheckpointOptions& options) {
  if (absl::Status s = CheckUpdatesSucceeded(trainer); !s.ok()) return s;  // 1
  return WriteCheckpointSnapshot(trainer, trainer.progress(), root, run, options, nullptr);
}

namespace {

// Steps 2-3's start: the root, its leftovers removed, and the empty temporary directory `tmp`.
absl::Status PrepareCheckpointDirectory(const std::string& root, const std::string& tmp,
                                        const CheckpointOptions& options) {
  if (absl::Status s = CheckModelDtype(options.model_dtype); !s.ok()) return s;
  if (options.keep_last < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("keep_last=", options.keep_last, " must be >= 0"));
  }
  std::error_code ec;
  const bool created = fs::create_directories(root, ec);
  if (ec) return absl::InternalError(absl::StrCat(root, ": cannot create: ", ec.message()));
  if (created) {
    // The root's own entry must be durable before a checkpoint inside it is reported committed.
    fs::path dir = fs::absolute(root, ec).lexically_normal();
    if (dir.filename().empty()) dir = dir.parent_path();  // "a/b/" names b
    if (absl::Status s = FsyncDirectory(dir.parent_path().string()); !s.ok()) return s;
  }
  if (absl::Status s = RemoveCheckpointLeftovers(root); !s.ok()) return s;  // 2
  return MakeDirectory(tmp);
}

// The rest of step 3 to step 8 into the prepared `tmp`; `optimizer_files` writes (or collects)
// the optimizer state's files and their records.
absl::Status FinishCheckpoint(Checkpointable& trainer, const TrainerProgress& progress,
                              const std::string& root, const std::string& tmp,
                              const std::string& final_path, const CheckpointRunInfo& run,
                              const CheckpointOptions& options,
                              const std::function<absl::Status(WrittenFiles*)>& optimizer_files) {
  TrainingState state;
  state.progress = progress;
  state.data_cursor = run.data_cursor;
  state.seed = run.seed;
  state.job_json = run.job_json;
  CheckpointManifest manifest;  // 3
  manifest.build_version = BuildVersionString();
  manifest.step = state.progress.step;
  manifest.model_dtype = std::string(SafetensorsDtypeName(options.model_dtype));
  manifest.data_files = run.data_files;
  WrittenFiles written;
  written.with_digests = options.record_provenance;
  if (absl::Status s =
          WriteModelFiles(trainer, tmp, options.model_dtype, options.max_shard_bytes, &written);
      !s.ok()) {
    return s;
  }
  if (run.hf_companion_files != nullptr) {
    if (absl::Status s = WriteCompanionFiles(tmp, *run.hf_companion_files, &written); !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = optimizer_files(&written); !s.ok()) return s;
  if (absl::Status s = WriteText(tmp, kTrainingStateFileName, TrainingStateToJson(state), &written);
      !s.ok()) {
    return s;
  }
  manifest.files = written.records;
  if (absl::Status s = WriteText(tmp, kManifestFileName, ManifestToJson(manifest), &written);
      !s.ok()) {
    return s;  // 4
  }
  if (options.record_provenance) {
    if (absl::Status s = WriteProvenanceFiles(tmp, root, state.progress.step, run.job_json,
                                              run.provenance.get(), std::move(written.digests));
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = FsyncDirectory(tmp); !s.ok()) return s;                     // 5
  if (absl::Status s = CommitDirectory(tmp, final_path, root); !s.ok()) return s;  // 6, 7
  return ApplyRetention(root, options.keep_last, final_path);                      // 8
}

}  // namespace

absl::StatusOr<std::string> WriteCheckpointSnapshot(Checkpointable& trainer,
                                                    const TrainerProgress& progress,
                                                    const std::string& root,
                                                    const CheckpointRunInfo& run,
                                                    const CheckpointOptions& options,
                                                    const std::function<void(int)>& entry_written) {
  // A ZeRO-1 rank holds only its shard of m and v: it writes with WriteShardedCheckpoint. Refused
  // before anything is created rather than half-way through.
  for (int e = 0; e < trainer.store().num_entries(); ++e) {
    if (!trainer.store().has_whole_optimizer_state(e)) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint: entry ", e,
                       "'s optimizer state is (partly) another rank's ZeRO-1 shard; "
                       "a ZeRO-1 rank writes with WriteShardedCheckpoint (docs/scale_out.md)"));
    }
  }
  const std::string name = CheckpointDirName(progress.step);
  const std::string tmp = absl::StrCat(root, "/.tmp-", name);
  const std::string final_path = absl::StrCat(root, "/", name);
  if (absl::Status s = PrepareCheckpointDirectory(root, tmp, options); !s.ok()) return s;
  const bool with_master = options.model_dtype != SafetensorsDtype::kF32;
  if (absl::Status s = FinishCheckpoint(trainer, progress, root, tmp, final_path, run, options,
                                        [&](WrittenFiles* written) {
                                          return WriteOptimizerFile(
                                              trainer, tmp, kOptimizerFileName, false, with_master,
                                              written, entry_written);
                                        });
      !s.ok()) {
    return s;
  }
  return final_path;
}

std::string OptimizerPieceName(const std::string& name, size_t begin, size_t end) {
  return absl::StrCat(name, "[", begin, ":", end, "]");
}

bool ParseOptimizerPieceName(const std::string& piece, std::string* name, size_t* begin,
                             size_t* end) {
  if (piece.empty() || piece.back() != ']') return false;
  const size_t open = piece.rfind('[');
  if (open == std::string::npos || open == 0) return false;
  const std::string_view inside(piece.data() + open + 1, piece.size() - open - 2);
  const size_t colon = inside.find(':');
  if (colon == std::string_view::npos) return false;
  uint64_t b = 0, e = 0;
  const std::string_view bs = inside.substr(0, colon), es = inside.substr(colon + 1);
  // Digits only (SimpleAtoi would take a sign or spaces): the writer's form, nothing else.
  const auto digits = [](std::string_view d) {
    return !d.empty() && d.size() <= 19 &&
           std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  const auto parse = [](std::string_view d, uint64_t* out) {
    return std::from_chars(d.data(), d.data() + d.size(), *out).ec == std::errc();
  };
  if (!digits(bs) || !digits(es) || !parse(bs, &b) || !parse(es, &e) || b >= e) {
    return false;
  }
  *name = piece.substr(0, open);
  *begin = b;
  *end = e;
  return true;
}

std::string OptimizerShardFileName(int rank, int world) {
  return absl::StrFormat("optimizer-rank-%05d-of-%05d.safetensors", rank, world);
}

absl::StatusOr<std::string> WriteShardedCheckpoint(Checkpointable& trainer, const std::string& root,
                                                   const CheckpointRunInfo& run,
                                                   const CheckpointOptions& options,
                                                   const ShardedCheckpointRanks& ranks) {
  if (ranks.world < 1 || ranks.rank < 0 || ranks.rank >= ranks.world || !ranks.all_ok) {
    return absl::InvalidArgumentError(absl::StrCat("sharded checkpoint: rank ", ranks.rank,
                                                   " of world ", ranks.world,
                                                   (ranks.all_ok ? "" : " without all_ok")));
  }
  // 1, agreed: a rank whose update failed ends the write on every rank.
  if (absl::Status s = ranks.all_ok(CheckUpdatesSucceeded(trainer)); !s.ok()) return s;
  const TrainerProgress progress = trainer.progress();
  const std::string name = CheckpointDirName(progress.step);
  const std::string tmp = absl::StrCat(root, "/.tmp-", name);
  const std::string final_path = absl::StrCat(root, "/", name);
  const bool lead = ranks.rank == 0;
  // Rank 0 prepares the directory; then every rank writes its shard into it; then rank 0 writes
  // the model, the state and the one manifest, and commits. Every rank passes every all_ok, so a
  // failure anywhere ends the write on every rank instead of leaving one waiting.
  absl::Status mine = lead ? PrepareCheckpointDirectory(root, tmp, options) : absl::OkStatus();
  if (absl::Status s = ranks.all_ok(mine); !s.ok()) return s;
  WrittenFiles shard;
  shard.with_digests = options.record_provenance;
  mine = WriteOptimizerFile(trainer, tmp, OptimizerShardFileName(ranks.rank, ranks.world), true,
                            options.model_dtype != SafetensorsDtype::kF32, &shard, nullptr);
  if (mine.ok()) mine = WriteShardSidecar(tmp, ranks.rank, shard);
  if (absl::Status s = ranks.all_ok(mine); !s.ok()) return s;
  if (lead) {
    mine = FinishCheckpoint(
        trainer, progress, root, tmp, final_path, run, options,
        [&](WrittenFiles* written) { return CollectShards(tmp, ranks.world, written); });
  }
  if (absl::Status s = ranks.all_ok(mine); !s.ok()) return s;
  return final_path;
}

absl::Status ExportHfModel(Checkpointable& trainer, const std::string& dir, SafetensorsDtype dtype,
                           uint64_t max_shard_bytes,
                           const std::vector<HfCompanionFile>& companions) {
  if (absl::Status s = CheckUpdatesSucceeded(trainer); !s.ok()) return s;
  std::error_code ec;
  if (fs::exists(dir, ec)) return absl::AlreadyExistsError(absl::StrCat(dir, ": already exists"));
  fs::path target = fs::absolute(dir, ec);
  const std::string parent = target.parent_path().string();
  const std::string tmp = absl::StrCat(parent, "/.tmp-export-", target.filename().string());
  fs::remove_all(tmp, ec);
  if (absl::Status s = MakeDirectory(tmp); !s.ok()) return s;
  WrittenFiles records;
  absl::Status written = WriteModelFiles(trainer, tmp, dtype, max_shard_bytes, &records);
  if (written.ok()) written = WriteCompanionFiles(tmp, companions, &records);
  if (!written.ok()) {
    fs::remove_all(tmp, ec);
    return written;
  }
  if (absl::Status s = FsyncDirectory(tmp); !s.ok()) return s;
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE) != 0) {
    return absl::InternalError(
        absl::StrCat("rename ", tmp, " -> ", dir, ": ", std::strerror(errno)));
  }
  return FsyncDirectory(parent);
}

}  // namespace megatrain::engine
