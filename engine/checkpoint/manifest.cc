// Manifest serialisation and checkpoint-directory verification.
#include "engine/checkpoint/manifest.h"

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/str_cat.h"
#include "engine/common/crc32c.h"
#include "engine/common/safe_files.h"
#include "engine/common/strict_json.h"
#include "engine/provenance/record.h"

namespace megatrain::engine {
namespace {

namespace fs = std::filesystem;

constexpr char kSelfCrcKey[] = "manifest_crc32c";
constexpr uint64_t kMaxManifestBytes = uint64_t{16} << 20;

uint32_t CrcOfText(const std::string& text) {
  return Crc32c(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

nlohmann::json ChecksumJson(const FileChecksum& c) {
  return {{"bytes", c.bytes}, {"crc32c", FormatCrc32c(c.crc32c)}};
}

bool ValidFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos && name != kManifestFileName;
}

// Reads obj[key] with the expected JSON type, naming the key on error.
absl::StatusOr<nlohmann::json> Field(const nlohmann::json& obj, const std::string& key,
                                     nlohmann::json::value_t type, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end())
    return absl::InvalidArgumentError(absl::StrCat(where, ": missing \"", key, "\""));
  const bool ok = type == nlohmann::json::value_t::number_unsigned ? it->is_number_unsigned()
                                                                   : it->type() == type;
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"", key, "\" has the wrong type: ", JsonForMessage(*it)));
  }
  return *it;
}

absl::Status OnlyKeys(const nlohmann::json& obj, const std::set<std::string>& keys,
                      const std::string& where) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (!keys.contains(it.key())) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": unknown key \"", it.key(), "\""));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<FileChecksum> ParseChecksum(const nlohmann::json& obj, const std::string& where) {
  absl::StatusOr<nlohmann::json> bytes =
      Field(obj, "bytes", nlohmann::json::value_t::number_unsigned, where);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<nlohmann::json> crc = Field(obj, "crc32c", nlohmann::json::value_t::string, where);
  if (!crc.ok()) return crc.status();
  const std::string text = crc->get<std::string>();
  if (text.size() != 10 || text.substr(0, 2) != "0x" ||
      text.find_first_not_of("0123456789abcdef", 2) != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": crc32c \"", text, "\" is not 0x + 8 hex digits"));
  }
  return FileChecksum{bytes->get<uint64_t>(), static_cast<uint32_t>(std::stoul(text, nullptr, 16))};
}

}  // namespace

std::string ManifestToJson(const CheckpointManifest& m) {
  nlohmann::json j = {{"format", kManifestFormatName},
                      {"version", m.version},
                      {"build", m.build_version},
                      {"step", m.step},
                      {"model_dtype", m.model_dtype}};
  nlohmann::json files = nlohmann::json::array();
  for (const ManifestFileRecord& f : m.files) {
    nlohmann::json r = ChecksumJson(f.checksum);
    r["name"] = f.name;
    files.push_back(std::move(r));
  }
  j["files"] = std::move(files);
  nlohmann::json data = nlohmann::json::array();
  for (const DataFileRecord& f : m.data_files) {
    nlohmann::json r = ChecksumJson(f.checksum);
    r["path"] = f.path;
    data.push_back(std::move(r));
  }
  j["data_files"] = std::move(data);
  j[kSelfCrcKey] = FormatCrc32c(CrcOfText(j.dump()));
  return j.dump(2) + "\n";
}

absl::StatusOr<CheckpointManifest> ParseManifest(std::string_view text, const std::string& source) {
  absl::StatusOr<nlohmann::json> parsed = ParseJsonStrict(text, source);
  if (!parsed.ok()) return parsed.status();
  nlohmann::json j = std::move(*parsed);
  if (!j.is_object())
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  using T = nlohmann::json::value_t;
  absl::StatusOr<nlohmann::json> format = Field(j, "format", T::string, source);
  if (!format.ok()) return format.status();
  if (*format != kManifestFormatName) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": format ", JsonForMessage(*format),
                                                   " is not \"", kManifestFormatName, "\""));
  }
  absl::StatusOr<nlohmann::json> version = Field(j, "version", T::number_unsigned, source);
  if (!version.ok()) return version.status();
  if (*version != kCheckpointFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": checkpoint format version ", JsonForMessage(*version),
        " is not supported (this build reads version ", kCheckpointFormatVersion, ")"));
  }
  if (absl::Status s = OnlyKeys(
          j,
          {"format", "version", "build", "step", "model_dtype", "files", "data_files", kSelfCrcKey},
          source);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<nlohmann::json> self = Field(j, kSelfCrcKey, T::string, source);
  if (!self.ok()) return self.status();
  const std::string recorded_self = self->get<std::string>();
  j.erase(kSelfCrcKey);
  const std::string actual_self = FormatCrc32c(CrcOfText(j.dump()));
  if (recorded_self != actual_self) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": manifest_crc32c ", recorded_self,
                                                   " does not match its content (", actual_self,
                                                   "): the manifest is corrupted"));
  }

  CheckpointManifest m;
  m.version = kCheckpointFormatVersion;
  absl::StatusOr<nlohmann::json> build = Field(j, "build", T::string, source);
  if (!build.ok()) return build.status();
  m.build_version = build->get<std::string>();
  absl::StatusOr<nlohmann::json> step = Field(j, "step", T::number_unsigned, source);
  if (!step.ok()) return step.status();
  m.step = step->get<uint64_t>();
  absl::StatusOr<nlohmann::json> dtype = Field(j, "model_dtype", T::string, source);
  if (!dtype.ok()) return dtype.status();
  m.model_dtype = dtype->get<std::string>();
  if (m.model_dtype != "F32" && m.model_dtype != "BF16" && m.model_dtype != "F16") {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": model_dtype \"", m.model_dtype, "\" is not F32, BF16 or F16"));
  }

  absl::StatusOr<nlohmann::json> files = Field(j, "files", T::array, source);
  if (!files.ok()) return files.status();
  std::set<std::string> names;
  for (size_t i = 0; i < files->size(); ++i) {
    const nlohmann::json& r = (*files)[i];
    const std::string where = absl::StrCat(source, ": files[", i, "]");
    if (!r.is_object()) return absl::InvalidArgumentError(absl::StrCat(where, ": not an object"));
    if (absl::Status s = OnlyKeys(r, {"name", "bytes", "crc32c"}, where); !s.ok()) return s;
    absl::StatusOr<nlohmann::json> name = Field(r, "name", T::string, where);
    if (!name.ok()) return name.status();
    ManifestFileRecord rec;
    rec.name = name->get<std::string>();
    if (!ValidFileName(rec.name) || !names.insert(rec.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": name \"", rec.name, "\" is not a plain, unique file name"));
    }
    absl::StatusOr<FileChecksum> sum = ParseChecksum(r, where);
    if (!sum.ok()) return sum.status();
    rec.checksum = *sum;
    m.files.push_back(std::move(rec));
  }
  absl::StatusOr<nlohmann::json> data = Field(j, "data_files", T::array, source);
  if (!data.ok()) return data.status();
  for (size_t i = 0; i < data->size(); ++i) {
    const nlohmann::json& r = (*data)[i];
    const std::string where = absl::StrCat(source, ": data_files[", i, "]");
    if (!r.is_object()) return absl::InvalidArgumentError(absl::StrCat(where, ": not an object"));
    if (absl::Status s = OnlyKeys(r, {"path", "bytes", "crc32c"}, where); !s.ok()) return s;
    absl::StatusOr<nlohmann::json> path = Field(r, "path", T::string, where);
    if (!path.ok()) return path.status();
    absl::StatusOr<FileChecksum> sum = ParseChecksum(r, where);
    if (!sum.ok()) return sum.status();
    m.data_files.push_back({path->get<std::string>(), *sum});
  }
  return m;
}

absl::StatusOr<CheckpointManifest> VerifyCheckpointDirectory(const std::string& dir) {
  const std::string manifest_path = absl::StrCat(dir, "/", kManifestFileName);
  absl::StatusOr<std::string> text = ReadRegularFile(manifest_path, kMaxManifestBytes);
  if (!text.ok()) return text.status();
  absl::StatusOr<CheckpointManifest> manifest = ParseManifest(*text, manifest_path);
  if (!manifest.ok()) return manifest.status();

  std::map<std::string, const ManifestFileRecord*> listed;
  for (const ManifestFileRecord& f : manifest->files) listed[f.name] = &f;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    // The provenance record covers the manifest, so it cannot be listed in it;
    // engine/provenance verifies it.
    if (name == kManifestFileName || name == provenance::kProvenanceFileName ||
        name == provenance::kSignatureFileName) {
      continue;
    }
    if (!listed.contains(name)) {
      return absl::FailedPreconditionError(
          absl::StrCat(dir, "/", name, ": not listed in ", kManifestFileName,
                       " (a checkpoint directory holds only the files it lists)"));
    }
  }
  if (ec) return absl::InternalError(absl::StrCat(dir, ": cannot list: ", ec.message()));
  // Sizes first: a missing or truncated file is reported without reading gigabytes.
  for (const ManifestFileRecord& f : manifest->files) {
    const std::string path = absl::StrCat(dir, "/", f.name);
    const fs::file_status status = fs::symlink_status(path, ec);
    if (ec || !fs::exists(status)) {
      return absl::DataLossError(
          absl::StrCat(path, ": missing (listed in ", kManifestFileName, ")"));
    }
    if (!fs::is_regular_file(status)) {
      return absl::DataLossError(absl::StrCat(path, ": not a regular file"));
    }
    const uint64_t size = fs::file_size(path, ec);
    if (ec) return absl::InternalError(absl::StrCat(path, ": ", ec.message()));
    if (size != f.checksum.bytes) {
      return absl::DataLossError(
          absl::StrCat(path, ": ", size, " bytes, but ", kManifestFileName, " records ",
                       f.checksum.bytes, size < f.checksum.bytes ? " (truncated)" : " (grown)"));
    }
  }
  for (const ManifestFileRecord& f : manifest->files) {
    const std::string path = absl::StrCat(dir, "/", f.name);
    absl::StatusOr<FileChecksum> sum = ChecksumFile(path, /*follow_symlinks=*/false);
    if (!sum.ok()) return sum.status();
    if (sum->bytes != f.checksum.bytes) {
      return absl::DataLossError(absl::StrCat(path, ": changed size while being verified"));
    }
    if (sum->crc32c != f.checksum.crc32c) {
      return absl::DataLossError(absl::StrCat(path, ": CRC32C ", FormatCrc32c(sum->crc32c),
                                              " does not match ", kManifestFileName, "'s ",
                                              FormatCrc32c(f.checksum.crc32c), " (corrupted)"));
    }
  }
  return manifest;
}

absl::StatusOr<std::vector<DataFileRecord>> ChecksumDataFiles(const std::vector<std::string>& paths,
                                                              const InputFiles* inputs) {
  std::vector<DataFileRecord> out;
  for (const std::string& p : paths) {
    absl::StatusOr<FileChecksum> sum;
    if (inputs == nullptr) {
      sum = ChecksumFile(p);
    } else {
      absl::StatusOr<int> fd = inputs->Descriptor(p);
      sum = fd.ok() ? ChecksumDescriptor(*fd, p) : absl::StatusOr<FileChecksum>(fd.status());
    }
    if (!sum.ok()) return sum.status();
    out.push_back({p, *sum});
  }
  return out;
}

absl::Status CheckDataFilesMatch(const std::vector<DataFileRecord>& recorded,
                                 const std::vector<DataFileRecord>& current) {
  for (size_t i = 0; i < std::max(recorded.size(), current.size()); ++i) {
    if (i >= recorded.size()) {
      return absl::FailedPreconditionError(
          absl::StrCat("data file ", current[i].path, " was not used by the checkpoint"));
    }
    if (i >= current.size()) {
      return absl::FailedPreconditionError(
          absl::StrCat("data file ", recorded[i].path, " of the checkpoint is not given now"));
    }
    const DataFileRecord& r = recorded[i];
    const DataFileRecord& c = current[i];
    if (r.path != c.path) {
      return absl::FailedPreconditionError(
          absl::StrCat("data file ", i, " is ", c.path, "; the checkpoint used ", r.path));
    }
    if (!(r.checksum == c.checksum)) {
      return absl::FailedPreconditionError(
          absl::StrCat("data file ", c.path, " changed since the checkpoint: ", c.checksum.bytes,
                       " bytes CRC32C ", FormatCrc32c(c.checksum.crc32c), ", recorded ",
                       r.checksum.bytes, " bytes CRC32C ", FormatCrc32c(r.checksum.crc32c)));
    }
  }
  return absl::OkStatus();
}

}  // namespace megatrain::engine
