// Checkpoint reader.
#include "engine/checkpoint/checkpoint_reader.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <map>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/checkpoint/checkpoint_writer.h"
#include "engine/common/safe_files.h"
#include "engine/common/strict_json.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors_reader.h"

namespace megatrain::engine {
namespace {

constexpr uint64_t kMaxJsonFileBytes = uint64_t{64} << 20;

// First line where two configs' JSON differ, for the error message.
std::string FirstDifference(const std::string& a, const std::string& b) {
  std::vector<std::string> la = absl::StrSplit(a, '\n'), lb = absl::StrSplit(b, '\n');
  for (size_t i = 0; i < std::max(la.size(), lb.size()); ++i) {
    const std::string x = i < la.size() ? la[i] : "", y = i < lb.size() ? lb[i] : "";
    if (x != y) return absl::StrCat("checkpoint has `", x, "`, the job has `", y, "`");
  }
  return "";
}

// One tensor to copy: source file and name -> destination (a pointer, or an
// element offset within an entry's staged m or v).
struct Copy {
  const SafetensorsFile* file = nullptr;
  std::string name;
  float* dest = nullptr;
  size_t elements = 0;
  size_t entry_offset = 0;
};

absl::Status PlanCopy(const SafetensorsFile& file, const std::string& name, const TensorSlot& slot,
                      bool must_be_f32, float* dest, std::vector<Copy>* plan) {
  const SafetensorsTensorInfo* info = file.Find(name);
  if (info == nullptr) {
    return absl::DataLossError(absl::StrCat(file.path(), ": tensor ", name, " is missing"));
  }
  if (info->shape != slot.shape) {
    return absl::DataLossError(absl::StrCat(file.path(), ": tensor ", name,
                                            " has a shape other than the layout's [",
                                            absl::StrJoin(slot.shape, ", "), "]"));
  }
  if (must_be_f32 ? info->dtype != SafetensorsDtype::kF32 : !IsFloatingDtype(info->dtype)) {
    return absl::DataLossError(absl::StrCat(file.path(), ": tensor ", name, " has dtype ",
                                            std::string(SafetensorsDtypeName(info->dtype)),
                                            must_be_f32 ? ", not F32" : ", not a float type"));
  }
  plan->push_back({&file, name, dest, slot.num_elements(), slot.offset});
  return absl::OkStatus();
}

// A ZeRO-1 shard's piece of an optimizer tensor: elements [begin, end) of it, under `name`.
struct Piece {
  const SafetensorsFile* file = nullptr;
  std::string name;
  size_t begin = 0;
  size_t end = 0;
};

// The copies of tensor `name` from its pieces, which must be F32, one-dimensional and cover the
// slot's elements exactly once.
absl::Status PlanPieceCopies(std::vector<Piece> pieces, const std::string& name,
                             const TensorSlot& slot, float* dest, std::vector<Copy>* plan) {
  std::sort(pieces.begin(), pieces.end(),
            [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
  size_t covered = 0;
  for (const Piece& p : pieces) {
    const SafetensorsTensorInfo* info = p.file->Find(p.name);
    const size_t n = p.end - p.begin;
    if (p.begin != covered || p.end > slot.num_elements()) {
      return absl::DataLossError(absl::StrCat(
          p.file->path(), ": ", p.name, " does not continue ", name, "'s pieces at element ",
          covered, " within its ", slot.num_elements(), " (a shard missing or from another run)"));
    }
    if (info->dtype != SafetensorsDtype::kF32 || info->shape.size() != 1 ||
        info->shape[0] != static_cast<int64_t>(n)) {
      return absl::DataLossError(
          absl::StrCat(p.file->path(), ": tensor ", p.name, " is not F32 of shape [", n, "]"));
    }
    plan->push_back(
        {p.file, p.name, dest == nullptr ? nullptr : dest + p.begin, n, slot.offset + p.begin});
    covered = p.end;
  }
  if (covered != slot.num_elements()) {
    return absl::DataLossError(absl::StrCat(name, ": its pieces cover ", covered, " of ",
                                            slot.num_elements(), " elements"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& dir, Checkpointable& trainer) {
  absl::StatusOr<CheckpointManifest> manifest = VerifyCheckpointDirectory(dir);
  if (!manifest.ok()) return manifest.status();
  std::set<std::string> files;
  for (const ManifestFileRecord& f : manifest->files) files.insert(f.name);
  for (const char* required : {"config.json", kTrainingStateFileName}) {
    if (!files.contains(required)) {
      return absl::DataLossError(
          absl::StrCat(dir, "/", required, ": missing from ", kManifestFileName));
    }
  }

  const std::string config_path = dir + "/config.json";
  absl::StatusOr<std::string> config_text = ReadRegularFile(config_path, kMaxJsonFileBytes);
  if (!config_text.ok()) return config_text.status();
  absl::StatusOr<ModelConfig> config = ParseModelConfig(*config_text);
  if (!config.ok())
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": ", config.status().message()));
  if (!(*config == trainer.config())) {
    return absl::FailedPreconditionError(
        absl::StrCat(config_path, ": the checkpoint's model differs from the job's: ",
                     FirstDifference(config->ToJson(), trainer.config().ToJson())));
  }

  const std::string state_path = absl::StrCat(dir, "/", kTrainingStateFileName);
  absl::StatusOr<std::string> state_text = ReadRegularFile(state_path, kMaxJsonFileBytes);
  if (!state_text.ok()) return state_text.status();
  absl::StatusOr<TrainingState> state = ParseTrainingState(*state_text, state_path);
  if (!state.ok()) return state.status();
  if (state->progress.step != manifest->step) {
    return absl::DataLossError(absl::StrCat(state_path, ": step ", state->progress.step,
                                            " differs from the manifest's step ", manifest->step));
  }

  // Model files: one file, or shards named by the index.
  std::vector<std::unique_ptr<SafetensorsFile>> opened;
  std::map<std::string, const SafetensorsFile*> model_file_of;  // tensor -> file
  auto open = [&](const std::string& name) -> absl::StatusOr<const SafetensorsFile*> {
    // Read, not mapped: a checkpoint directory may be writable by others (an output_dir), and a
    // file truncated while mapped would kill the daemon with SIGBUS (issue 16, point 4).
    absl::StatusOr<SafetensorsFile> f = SafetensorsFile::OpenUnmapped(absl::StrCat(dir, "/", name));
    if (!f.ok()) return f.status();
    opened.push_back(std::make_unique<SafetensorsFile>(std::move(*f)));
    return opened.back().get();
  };
  if (files.contains("model.safetensors")) {
    absl::StatusOr<const SafetensorsFile*> f = open("model.safetensors");
    if (!f.ok()) return f.status();
    for (const std::string& n : (*f)->names()) model_file_of[n] = *f;
  } else if (files.contains("model.safetensors.index.json")) {
    const std::string index_path = dir + "/model.safetensors.index.json";
    absl::StatusOr<std::string> text = ReadRegularFile(index_path, kMaxJsonFileBytes);
    if (!text.ok()) return text.status();
    absl::StatusOr<nlohmann::json> index = ParseJsonStrict(*text, index_path);
    if (!index.ok()) return index.status();
    auto map = index->find("weight_map");
    if (!index->is_object() || map == index->end() || !map->is_object()) {
      return absl::DataLossError(absl::StrCat(index_path, ": no \"weight_map\" object"));
    }
    std::map<std::string, const SafetensorsFile*> shards;
    for (auto it = map->begin(); it != map->end(); ++it) {
      if (!it->is_string() || !files.contains(it->get<std::string>()) ||
          !it->get<std::string>().ends_with(".safetensors")) {
        return absl::DataLossError(absl::StrCat(index_path, ": tensor ", it.key(), " maps to ",
                                                JsonForMessage(*it),
                                                ", not a safetensors file of the checkpoint"));
      }
      const std::string shard = it->get<std::string>();
      if (!shards.contains(shard)) {
        absl::StatusOr<const SafetensorsFile*> f = open(shard);
        if (!f.ok()) return f.status();
        shards[shard] = *f;
      }
      model_file_of[it.key()] = shards[shard];
    }
  } else {
    return absl::DataLossError(
        absl::StrCat(dir, ": neither model.safetensors nor model.safetensors.index.json"));
  }
  // The optimizer state: optimizer.safetensors, or a ZeRO-1 checkpoint's shards
  // optimizer-rank-R-of-W (every R of one W), each tensor in exactly one of them.
  std::vector<const SafetensorsFile*> optimizer_files;
  if (files.contains(kOptimizerFileName)) {
    absl::StatusOr<const SafetensorsFile*> f = open(kOptimizerFileName);
    if (!f.ok()) return f.status();
    optimizer_files.push_back(*f);
  } else {
    int world = 0;
    for (const std::string& f : files) {
      int r = 0, w = 0;
      if (std::sscanf(f.c_str(), "optimizer-rank-%d-of-%d.safetensors", &r, &w) == 2 &&
          f == OptimizerShardFileName(r, w)) {
        if (r < 0 || w < 1 || r >= w) {
          return absl::DataLossError(absl::StrCat(dir, "/", f, ": rank ", r, " of world ", w,
                                                  " is not a shard of a world of ranks"));
        }
        world = w;
      }
    }
    if (world == 0) {
      return absl::DataLossError(absl::StrCat(dir, ": neither ", kOptimizerFileName,
                                              " nor optimizer shards in ", kManifestFileName));
    }
    for (int r = 0; r < world; ++r) {
      const std::string name = OptimizerShardFileName(r, world);
      if (!files.contains(name)) {
        return absl::DataLossError(
            absl::StrCat(dir, "/", name, ": missing from ", kManifestFileName));
      }
      absl::StatusOr<const SafetensorsFile*> f = open(name);
      if (!f.ok()) return f.status();
      optimizer_files.push_back(*f);
    }
  }
  std::map<std::string, const SafetensorsFile*> optimizer_file_of;  // tensor or piece -> file
  // ZeRO-1 shards' pieces of a tensor (OptimizerPieceName), by the tensor's name.
  std::map<std::string, std::vector<Piece>> pieces_of;
  for (const SafetensorsFile* f : optimizer_files) {
    for (const SafetensorsTensorInfo& t : f->tensors()) {
      if (!optimizer_file_of.emplace(t.name, f).second) {
        return absl::DataLossError(absl::StrCat(f->path(), ": tensor ", t.name, " is also in ",
                                                optimizer_file_of[t.name]->path()));
      }
      Piece piece{f, t.name};
      std::string whole;
      if (ParseOptimizerPieceName(t.name, &whole, &piece.begin, &piece.end)) {
        pieces_of[whole].push_back(piece);
      }
    }
  }
  // Optimizer tensors found, a tensor in pieces counted once.
  size_t optimizer_tensors = optimizer_file_of.size();
  for (const auto& [name, pieces] : pieces_of) {
    if (optimizer_file_of.contains(name)) {
      return absl::DataLossError(absl::StrCat(optimizer_file_of[name]->path(), ": tensor ", name,
                                              " is also in pieces, as ", pieces.front().name,
                                              " of ", pieces.front().file->path()));
    }
    optimizer_tensors -= pieces.size() - 1;
  }
  // Plans the copy of optimizer tensor `name`, whole or from its pieces.
  const auto plan_optimizer_copy = [&](const std::string& name, const TensorSlot& slot, float* dest,
                                       std::vector<Copy>* plan) -> absl::Status {
    auto it = optimizer_file_of.find(name);
    if (it != optimizer_file_of.end() || !pieces_of.contains(name)) {
      // Whole (the first file when none holds it: PlanCopy names it missing).
      return PlanCopy(it != optimizer_file_of.end() ? *it->second : *optimizer_files.front(), name,
                      slot, true, dest, plan);
    }
    return PlanPieceCopies(pieces_of[name], name, slot, dest, plan);
  };

  // Plan every copy, checking names, shapes and dtypes, before writing anything.
  const bool master_in_optimizer = manifest->model_dtype != "F32";
  const ParameterLayout& layout = trainer.layout();
  ParameterStore& store = trainer.mutable_store();
  std::vector<Copy> plan;
  // Per entry, the m and v copies, their dest an element offset in the entry.
  std::vector<std::array<std::vector<Copy>, 2>> state_plan(layout.num_entries());
  size_t layout_tensors = 0;
  // A master on the NVMe tier is read into RAM scratch of the entry's size
  // (ParameterStore::MasterScratch), then written through the store with m
  // and v below. An entry without such RAM (every array on NVMe) is read
  // with m and v, one entry at a time, through one staging buffer.
  std::vector<float*> master_dests(layout.num_entries());
  std::vector<std::vector<Copy>> staged_master_plan(layout.num_entries());
  for (int e = 0; e < layout.num_entries(); ++e) master_dests[e] = store.MasterScratch(e);
  const auto master_dest = [&master_dests](int e) { return master_dests[e]; };
  for (int e = 0; e < layout.num_entries(); ++e) {
    float* const master = master_dest(e);
    std::vector<Copy>& master_plan = master == nullptr ? staged_master_plan[e] : plan;
    for (const TensorSlot& slot : layout.entries()[e].tensors) {
      ++layout_tensors;
      auto it = model_file_of.find(slot.hf_name);
      if (it == model_file_of.end()) {
        return absl::DataLossError(
            absl::StrCat(dir, ": model tensor ", slot.hf_name, " is missing"));
      }
      absl::Status s;
      if (master_in_optimizer) {
        std::vector<Copy> unused;
        s = PlanCopy(*it->second, slot.hf_name, slot, false, nullptr, &unused);  // shape check only
        if (s.ok())
          s = plan_optimizer_copy("master." + slot.hf_name, slot,
                                  master == nullptr ? nullptr : master + slot.offset, &master_plan);
      } else {
        s = PlanCopy(*it->second, slot.hf_name, slot, true,
                     master == nullptr ? nullptr : master + slot.offset, &master_plan);
      }
      // m and v land in per-entry staging (see below), at the slot's offset.
      if (s.ok()) {
        s = plan_optimizer_copy("m." + slot.hf_name, slot, nullptr, &state_plan[e][0]);
      }
      if (s.ok()) {
        s = plan_optimizer_copy("v." + slot.hf_name, slot, nullptr, &state_plan[e][1]);
      }
      if (!s.ok()) return s;
    }
  }
  if (model_file_of.size() != layout_tensors) {
    for (const auto& [name, file] : model_file_of) {
      if (!layout.Find(name).ok()) {
        return absl::DataLossError(
            absl::StrCat(file->path(), ": tensor ", name, " is not in the model"));
      }
    }
  }
  // Pieces of a tensor the model does not have (or not of master/m/v) would only show in the
  // count below: name them.
  for (const auto& [name, pieces] : pieces_of) {
    const size_t dot = name.find('.');
    const std::string kind = dot == std::string::npos ? "" : name.substr(0, dot);
    const bool known_kind = kind == "m" || kind == "v" || (kind == "master" && master_in_optimizer);
    if (!known_kind || !layout.Find(name.substr(dot + 1)).ok()) {
      return absl::DataLossError(absl::StrCat(pieces.front().file->path(), ": tensor ",
                                              pieces.front().name, " is a piece of ", name,
                                              ", which is not in the model's optimizer state"));
    }
  }
  const size_t optimizer_expected = layout_tensors * (master_in_optimizer ? 3 : 2);
  if (optimizer_tensors != optimizer_expected) {
    return absl::DataLossError(absl::StrCat(
        optimizer_files.front()->path(), optimizer_files.size() > 1 ? " and the other shards" : "",
        ": ", optimizer_tensors, " tensors, expected ", optimizer_expected));
  }

  trainer.WaitForUpdates();
  size_t largest_staged_master = 0;
  for (int e = 0; e < store.num_entries(); ++e) {
    if (master_dest(e) == nullptr) {
      largest_staged_master = std::max(largest_staged_master, store.spec(e).elements);
      continue;
    }
    std::fill(master_dest(e), master_dest(e) + store.spec(e).elements, 0.0f);
  }
  std::vector<float> staged_master(largest_staged_master);
  for (const Copy& c : plan) {
    // Cannot fail after the checks above; a failure here is a broken invariant.
    absl::Status s = c.file->ReadFloat32(c.name, absl::MakeSpan(c.dest, c.elements));
    if (!s.ok()) {
      return absl::InternalError(absl::StrCat("after verification, reading ", c.name, " failed: ",
                                              s.message(), "; the trainer is now inconsistent"));
    }
  }
  // m and v: one entry at a time through the store (RAM or the NVMe tier). A ZeRO-1 rank keeps
  // only its own ranges' (every entry was verified above all the same), so any world size loads.
  for (int e = 0; e < store.num_entries(); ++e) {
    if (!store.has_optimizer_state(e)) continue;
    const size_t n = store.spec(e).elements;
    // Only the elements whose m and v the store holds (a ZeRO-1 rank's range) are staged and
    // read: a rank loads its 1/W, whatever the shards the checkpoint was cut in.
    const ElementRange range = store.optimizer_state_range(e);
    std::vector<float> staged[2] = {std::vector<float>(range.count, 0.0f),
                                    std::vector<float>(range.count, 0.0f)};
    for (int a = 0; a < 2; ++a) {
      for (const Copy& c : state_plan[e][a]) {
        const size_t lo = std::max(range.first, c.entry_offset);
        const size_t hi = std::min(range.end(), c.entry_offset + c.elements);
        if (lo >= hi) continue;
        absl::Status s = c.file->ReadFloat32Range(
            c.name, lo - c.entry_offset,
            absl::MakeSpan(staged[a].data() + (lo - range.first), hi - lo));
        if (!s.ok()) {
          return absl::InternalError(absl::StrCat("after verification, reading ", c.name,
                                                  " failed: ", s.message(),
                                                  "; the trainer is now inconsistent"));
        }
      }
    }
    if (absl::Status s = store.WriteOptimizerState(e, staged[0].data(), staged[1].data());
        !s.ok()) {
      return s;
    }
    if (master_dest(e) == nullptr) {
      std::fill(staged_master.begin(), staged_master.begin() + n, 0.0f);
      for (const Copy& c : staged_master_plan[e]) {
        absl::Status s = c.file->ReadFloat32(
            c.name, absl::MakeSpan(staged_master.data() + c.entry_offset, c.elements));
        if (!s.ok()) {
          return absl::InternalError(absl::StrCat("after verification, reading ", c.name,
                                                  " failed: ", s.message(),
                                                  "; the trainer is now inconsistent"));
        }
      }
      if (absl::Status s = store.WriteMaster(e, staged_master.data()); !s.ok()) return s;
    } else if (store.master_on_nvme()) {
      if (absl::Status s = store.WriteMasterFromScratch(e, master_dest(e)); !s.ok()) return s;
    }
  }
  if (absl::Status s = store.Flush(); !s.ok()) return s;
  trainer.RestoreProgress(state->progress);
  return LoadedCheckpoint{std::move(*manifest), std::move(*state)};
}

}  // namespace megatrain::engine
