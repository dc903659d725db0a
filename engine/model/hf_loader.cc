// LoadHfWeights: fills a ParameterLayout's fp32 entry buffers from a Hugging Face model directory.
#include "engine/model/hf_loader.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/common/safe_files.h"
#include "engine/common/strict_json.h"
#include "engine/model/safetensors_reader.h"

namespace megatrain::engine {
namespace {

namespace fs = std::filesystem;

constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";
constexpr std::string_view kPickleSuffixes[] = {".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle"};

std::string ShapeText(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Tensors some exporters include that carry no trainable state.
bool IsHarmlessExtra(std::string_view name) { return name.ends_with(".rotary_emb.inv_freq"); }

// The weight files to read, and for sharded checkpoints the index's mapping.
struct WeightFiles {
  std::vector<std::string> files;               // basenames inside dir, sorted
  std::map<std::string, std::string> shard_of;  // tensor -> basename; empty if unsharded
  bool sharded = false;
};

absl::StatusOr<WeightFiles> ParseIndex(const std::string& dir, const InputFiles* inputs) {
  const std::string path = absl::StrCat(dir, "/", kIndexFile);
  auto text = ReadInputFile(inputs, path);
  if (!text.ok()) return text.status();
  auto root = ParseJsonStrict(*text, path);
  if (!root.ok()) return root.status();
  auto fail = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", parts...));
  };
  if (!root->is_object()) return fail("top level is not a JSON object");
  for (const auto& [key, value] : root->items()) {
    if (key != "metadata" && key != "weight_map") {
      return fail("unsupported key '", key, "' = ", JsonForMessage(value));
    }
  }
  auto map_it = root->find("weight_map");
  if (map_it == root->end() || !map_it->is_object()) {
    return fail("'weight_map' is missing or not an object");
  }
  WeightFiles result;
  result.sharded = true;
  std::set<std::string> files;
  for (const auto& [name, shard] : map_it->items()) {
    if (!shard.is_string()) {
      return fail("weight_map['", name, "'] = ", JsonForMessage(shard), " is not a file name");
    }
    const std::string& file = shard.get_ref<const std::string&>();
    for (std::string_view suffix : kPickleSuffixes) {
      if (file.ends_with(suffix)) {
        return absl::InvalidArgumentError(
            absl::StrCat(dir, "/", file,
                         ": pickle-based weights are not loaded (they can execute code); convert "
                         "to safetensors"));
      }
    }
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == ".." ||
        !file.ends_with(".safetensors")) {
      return fail("weight_map['", name, "'] = \"", file,
                  "\" is not a .safetensors file name inside the model directory");
    }
    result.shard_of[name] = file;
    files.insert(file);
  }
  result.files.assign(files.begin(), files.end());
  return result;
}

absl::StatusOr<WeightFiles> FindWeightFiles(const std::string& dir, const InputFiles* inputs) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat(dir, ": not a directory"));
  }
  // With checked inputs, what the directory held when the job started decides, not what it
  // holds now.
  auto present = [&](const char* name) {
    const std::string path = absl::StrCat(dir, "/", name);
    return inputs != nullptr ? inputs->Has(path) : fs::exists(path, ec);
  };
  if (present(kSingleFile)) {
    WeightFiles result;
    result.files = {kSingleFile};
    return result;
  }
  if (present(kIndexFile)) return ParseIndex(dir, inputs);
  std::vector<std::string> pickles;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    for (std::string_view suffix : kPickleSuffixes) {
      if (name.ends_with(suffix)) pickles.push_back(it->path().string());
    }
  }
  if (!pickles.empty()) {
    std::sort(pickles.begin(), pickles.end());
    return absl::InvalidArgumentError(absl::StrCat(
        pickles.front(),
        ": pickle-based weights are not loaded (they can execute code); convert to safetensors"));
  }
  return absl::NotFoundError(
      absl::StrCat(dir, ": no ", kSingleFile, " or ", kIndexFile, " (safetensors weights)"));
}

void ZeroPadding(const LayoutEntry& entry, float* buffer) {
  size_t covered = 0;
  for (const TensorSlot& slot : entry.tensors) {
    std::fill(buffer + covered, buffer + slot.offset, 0.0f);
    covered = slot.offset + slot.num_elements();
  }
  std::fill(buffer + covered, buffer + entry.num_elements, 0.0f);
}

class Loader {
 public:
  Loader(const std::string& dir, const ParameterLayout& layout, absl::Span<float* const> buffers,
         const InputFiles* inputs)
      : dir_(dir), layout_(layout), buffers_(buffers), inputs_(inputs) {}

  absl::Status Run() {
    if (buffers_.size() != static_cast<size_t>(layout_.num_entries())) {
      return absl::InvalidArgumentError(absl::StrCat("LoadHfWeights: ", buffers_.size(),
                                                     " entry buffers for a layout of ",
                                                     layout_.num_entries(), " entries"));
    }
    auto files = FindWeightFiles(dir_, inputs_);
    if (!files.ok()) return files.status();
    files_ = std::move(*files);
    for (int e = 0; e < layout_.num_entries(); ++e) {
      if (buffers_[e] != nullptr) ZeroPadding(layout_.entries()[e], buffers_[e]);
    }
    for (const std::string& file : files_.files) {
      auto status = LoadFile(file);
      if (!status.ok()) return status;
    }
    auto status = CheckAllLoaded();
    if (!status.ok()) return status;
    return CheckTiedHead();
  }

 private:
  absl::Status LoadFile(const std::string& basename) {
    const std::string path = absl::StrCat(dir_, "/", basename);
    auto file = SafetensorsFile::Open(path, inputs_);
    if (!file.ok()) return file.status();
    for (const SafetensorsTensorInfo& info : file->tensors()) {
      if (files_.sharded) {
        auto it = files_.shard_of.find(info.name);
        if (it == files_.shard_of.end()) {
          return absl::InvalidArgumentError(
              absl::StrCat(path, ": tensor '", info.name, "' is not listed in ", kIndexFile));
        }
        if (it->second != basename) {
          return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", info.name, "' is in ",
                                                         basename, " but ", kIndexFile,
                                                         " maps it to ", it->second));
        }
      }
      auto status = LoadTensor(*file, info);
      if (!status.ok()) return status;
    }
    if (files_.sharded) {
      for (const auto& [name, shard] : files_.shard_of) {
        if (shard == basename && file->Find(name) == nullptr) {
          return absl::InvalidArgumentError(absl::StrCat(path, ": ", kIndexFile, " maps tensor '",
                                                         name, "' here but the file lacks it"));
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status LoadTensor(const SafetensorsFile& file, const SafetensorsTensorInfo& info) {
    auto location = layout_.Find(info.name);
    if (!location.ok()) {
      if (IsHarmlessExtra(info.name)) return absl::OkStatus();
      if (layout_.tied_embeddings() && info.name == "lm_head.weight") {
        const TensorSlot* embed = layout_.Find(layout_.embedding_entry(), TensorRole::kEmbedding);
        if (info.shape != embed->shape) {
          return ShapeError(file, info, embed->shape);
        }
        if (tied_head_file_.has_value()) {
          return absl::InvalidArgumentError(
              absl::StrCat(file.path(), ": tensor 'lm_head.weight' appears more than once"));
        }
        tied_head_file_ = file.path();
        return absl::OkStatus();
      }
      return absl::InvalidArgumentError(absl::StrCat(file.path(), ": unexpected tensor '",
                                                     info.name, "' ", ShapeText(info.shape),
                                                     "; the model config has no such parameter"));
    }
    const TensorSlot& slot = *location->slot;
    if (!loaded_.insert(info.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.path(), ": tensor '", info.name, "' appears more than once"));
    }
    if (info.shape != slot.shape) return ShapeError(file, info, slot.shape);
    if (!IsFloatingDtype(info.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          file.path(), ": tensor '", info.name, "' has dtype ",
          std::string(SafetensorsDtypeName(info.dtype)), "; expected F32, BF16, F16 or F64"));
    }
    if (buffers_[location->entry] == nullptr) return absl::OkStatus();  // checked, not read
    float* dst = buffers_[location->entry] + slot.offset;
    return file.ReadFloat32(info.name, absl::Span<float>(dst, slot.num_elements()));
  }

  absl::Status ShapeError(const SafetensorsFile& file, const SafetensorsTensorInfo& info,
                          const std::vector<int64_t>& expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": tensor '", info.name, "' has shape ", ShapeText(info.shape),
                     "; the model config expects ", ShapeText(expected)));
  }

  absl::Status CheckAllLoaded() {
    std::vector<std::string> missing;
    for (const LayoutEntry& entry : layout_.entries()) {
      for (const TensorSlot& slot : entry.tensors) {
        if (!loaded_.count(slot.hf_name)) missing.push_back(slot.hf_name);
      }
    }
    if (missing.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        dir_, ": tensor '", missing.front(), "' ",
        ShapeText(layout_.Find(missing.front())->slot->shape), " is missing (", missing.size(),
        " tensor", missing.size() == 1 ? "" : "s", " missing in all)"));
  }

  // lm_head.weight in a tied checkpoint must be a copy of the embedding:
  // compared after conversion to fp32, chunk by chunk, bit for bit.
  absl::Status CheckTiedHead() {
    if (!tied_head_file_.has_value()) return absl::OkStatus();
    if (buffers_[layout_.embedding_entry()] == nullptr) return absl::OkStatus();
    auto file = SafetensorsFile::Open(*tied_head_file_, inputs_);
    if (!file.ok()) return file.status();
    const TensorSlot* embed = layout_.Find(layout_.embedding_entry(), TensorRole::kEmbedding);
    const float* embed_values = buffers_[layout_.embedding_entry()] + embed->offset;
    const size_t total = embed->num_elements();
    constexpr size_t kChunk = size_t{1} << 18;
    std::vector<float> chunk(std::min(total, kChunk));
    for (size_t first = 0; first < total; first += kChunk) {
      const size_t n = std::min(kChunk, total - first);
      auto status =
          file->ReadFloat32Range("lm_head.weight", first, absl::Span<float>(chunk.data(), n));
      if (!status.ok()) return status;
      if (std::memcmp(chunk.data(), embed_values + first, n * sizeof(float)) != 0) {
        size_t i = 0;
        while (std::memcmp(&chunk[i], embed_values + first + i, sizeof(float)) == 0) ++i;
        return absl::InvalidArgumentError(
            absl::StrCat(*tied_head_file_,
                         ": tensor 'lm_head.weight' differs from model.embed_tokens.weight "
                         "(first at element ",
                         first + i, ") but config.json has tie_word_embeddings = true"));
      }
    }
    return absl::OkStatus();
  }

  const std::string& dir_;
  const ParameterLayout& layout_;
  absl::Span<float* const> buffers_;
  const InputFiles* inputs_;  // null: files opened by path
  WeightFiles files_;
  std::set<std::string, std::less<>> loaded_;
  std::optional<std::string> tied_head_file_;
};

}  // namespace

absl::StatusOr<SafetensorsDtype> HfWeightsDtype(const std::string& dir, const InputFiles* inputs) {
  absl::StatusOr<WeightFiles> files = FindWeightFiles(dir, inputs);
  if (!files.ok()) return files.status();
  for (const std::string& name : files->files) {
    absl::StatusOr<SafetensorsFile> file =
        SafetensorsFile::Open(absl::StrCat(dir, "/", name), inputs);
    if (!file.ok()) return file.status();
    for (const SafetensorsTensorInfo& t : file->tensors()) {
      if (IsFloatingDtype(t.dtype)) return t.dtype;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(dir, ": no floating-point weights"));
}

absl::Status LoadHfWeights(const std::string& dir, const ParameterLayout& layout,
                           absl::Span<float* const> entry_buffers, const InputFiles* inputs) {
  return Loader(dir, layout, entry_buffers, inputs).Run();
}

}  // namespace megatrain::engine
