// Lineage JSON form and input hashing.
#include "engine/provenance/lineage.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "engine/common/build_version.h"
#include "engine/provenance/json_fields.h"
#include "engine/provenance/sha256.h"

// Provided by //engine/provenance:build_commit (stamped with the source
// commit) in the binaries that link it; absent (null) elsewhere.
extern "C" const char* megatrain_build_commit() __attribute__((weak));

namespace megatrain::provenance {
namespace {

namespace fs = std::filesystem;
namespace jf = json_fields;

absl::StatusOr<InputFile> ParseInput(const nlohmann::json& v, const std::string& where) {
  if (absl::Status s = jf::ExactKeys(v, {"role", "path", "sha256", "bytes"}, where); !s.ok()) {
    return s;
  }
  InputFile f;
  absl::StatusOr<std::string> role = jf::String(v, "role", where);
  if (!role.ok()) return role.status();
  if (*role != kRoleBaseModel && *role != kRoleData && *role != kRoleTokenizer) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".role: \"", *role, "\" is not ",
                                                   kRoleBaseModel, ", ", kRoleData, " or ",
                                                   kRoleTokenizer));
  }
  f.role = *role;
  absl::StatusOr<std::string> path = jf::String(v, "path", where);
  if (!path.ok()) return path.status();
  f.path = *path;
  absl::StatusOr<std::string> sha = jf::Hex(v, "sha256", 64, where);
  if (!sha.ok()) return sha.status();
  f.sha256_hex = *sha;
  absl::StatusOr<uint64_t> bytes = jf::Unsigned(v, "bytes", where);
  if (!bytes.ok()) return bytes.status();
  f.bytes = *bytes;
  return f;
}

absl::StatusOr<DataChange> ParseDataChange(const nlohmann::json& v, const std::string& where) {
  if (absl::Status s =
          jf::ExactKeys(v, {"path", "old_sha256", "new_sha256", "allowed_at", "reason"}, where);
      !s.ok()) {
    return s;
  }
  DataChange c;
  for (auto [key, field] : {std::pair{"path", &c.path}, std::pair{"allowed_at", &c.allowed_at},
                            std::pair{"reason", &c.reason}}) {
    absl::StatusOr<std::string> text = jf::String(v, key, where);
    if (!text.ok()) return text.status();
    *field = *text;
  }
  for (auto [key, field] :
       {std::pair{"old_sha256", &c.old_sha256_hex}, std::pair{"new_sha256", &c.new_sha256_hex}}) {
    absl::StatusOr<std::string> hex = jf::Hex(v, key, 64, where);
    if (!hex.ok()) return hex.status();
    *field = *hex;
  }
  return c;
}

}  // namespace

BuildInfo CurrentBuild() {
  BuildInfo b;
  b.version = engine::kMegatrainVersion;
  b.commit = megatrain_build_commit != nullptr ? megatrain_build_commit() : "unknown";
#if defined(__VERSION__)
  b.compiler = __VERSION__;
#else
  b.compiler = "unknown";
#endif
  return b;
}

nlohmann::ordered_json LineageToJsonValue(const Lineage& l) {
  nlohmann::ordered_json inputs = nlohmann::ordered_json::array();
  for (const InputFile& f : l.inputs) {
    inputs.push_back(
        {{"role", f.role}, {"path", f.path}, {"sha256", f.sha256_hex}, {"bytes", f.bytes}});
  }
  nlohmann::ordered_json changes = nlohmann::ordered_json::array();
  for (const DataChange& c : l.data_changes) {
    changes.push_back({{"path", c.path},
                       {"old_sha256", c.old_sha256_hex},
                       {"new_sha256", c.new_sha256_hex},
                       {"allowed_at", c.allowed_at},
                       {"reason", c.reason}});
  }
  return {
      {"job_spec_json", l.job_spec_json},
      {"inputs", std::move(inputs)},
      {"build",
       {{"version", l.build.version}, {"commit", l.build.commit}, {"compiler", l.build.compiler}}},
      {"device_kind", l.device_kind},
      {"data_changes", std::move(changes)}};
}

absl::StatusOr<Lineage> LineageFromJsonValue(const nlohmann::json& v, const std::string& source) {
  if (absl::Status s = jf::ExactKeys(
          v, {"job_spec_json", "inputs", "build", "device_kind", "data_changes"}, source);
      !s.ok()) {
    return s;
  }
  Lineage l;
  absl::StatusOr<std::string> spec = jf::String(v, "job_spec_json", source);
  if (!spec.ok()) return spec.status();
  l.job_spec_json = *spec;
  absl::StatusOr<std::string> device = jf::String(v, "device_kind", source);
  if (!device.ok()) return device.status();
  l.device_kind = *device;

  const std::string build_where = source + ".build";
  const nlohmann::json& build = v.at("build");
  if (absl::Status s = jf::ExactKeys(build, {"version", "commit", "compiler"}, build_where);
      !s.ok()) {
    return s;
  }
  for (auto [key, field] :
       {std::pair{"version", &l.build.version}, std::pair{"commit", &l.build.commit},
        std::pair{"compiler", &l.build.compiler}}) {
    absl::StatusOr<std::string> text = jf::String(build, key, build_where);
    if (!text.ok()) return text.status();
    *field = *text;
  }

  absl::StatusOr<const nlohmann::json*> inputs = jf::Array(v, "inputs", source);
  if (!inputs.ok()) return inputs.status();
  for (size_t i = 0; i < (*inputs)->size(); ++i) {
    absl::StatusOr<InputFile> f =
        ParseInput((**inputs)[i], absl::StrCat(source, ".inputs[", i, "]"));
    if (!f.ok()) return f.status();
    l.inputs.push_back(*std::move(f));
  }
  absl::StatusOr<const nlohmann::json*> changes = jf::Array(v, "data_changes", source);
  if (!changes.ok()) return changes.status();
  for (size_t i = 0; i < (*changes)->size(); ++i) {
    absl::StatusOr<DataChange> c =
        ParseDataChange((**changes)[i], absl::StrCat(source, ".data_changes[", i, "]"));
    if (!c.ok()) return c.status();
    l.data_changes.push_back(*std::move(c));
  }
  return l;
}

std::string LineageToJson(const Lineage& lineage) {
  return LineageToJsonValue(lineage).dump(2) + "\n";
}

absl::StatusOr<Lineage> ParseLineage(std::string_view text, const std::string& source) {
  const nlohmann::json value = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(source, ": not JSON"));
  return LineageFromJsonValue(value, source);
}

absl::StatusOr<std::vector<InputFile>> HashInputs(const std::string& role,
                                                  const std::vector<std::string>& paths,
                                                  const engine::InputFiles* inputs) {
  std::vector<InputFile> out;
  auto add = [&](const std::string& path) -> absl::Status {
    if (inputs != nullptr && inputs->Has(path)) {
      absl::StatusOr<uint64_t> bytes = inputs->Size(path);
      if (!bytes.ok()) return bytes.status();
      absl::StatusOr<int> fd = inputs->Descriptor(path);
      if (!fd.ok()) return fd.status();
      absl::StatusOr<std::string> sha = Sha256DescriptorHex(*fd, path);
      if (!sha.ok()) return sha.status();
      out.push_back({role, path, *sha, *bytes});
      return absl::OkStatus();
    }
    std::error_code ec;
    const uint64_t bytes = fs::file_size(path, ec);
    if (ec) return absl::NotFoundError(absl::StrCat(path, ": cannot stat: ", ec.message()));
    absl::StatusOr<std::string> sha = Sha256FileHex(path);
    if (!sha.ok()) return sha.status();
    out.push_back({role, path, *sha, bytes});
    return absl::OkStatus();
  };
  for (const std::string& path : paths) {
    std::error_code ec;
    if ((inputs != nullptr && inputs->Has(path)) || !fs::is_directory(path, ec)) {
      if (absl::Status s = add(path); !s.ok()) return s;
      continue;
    }
    std::vector<std::string> files;
    for (fs::recursive_directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
      if (it->is_regular_file(ec)) files.push_back(it->path().string());
    }
    if (ec) return absl::InternalError(absl::StrCat(path, ": cannot list: ", ec.message()));
    std::sort(files.begin(), files.end());
    for (const std::string& f : files) {
      // With a held set (a daemon's run), a directory's files outside it are what the run never
      // reads (a README, a symlink to a file outside the roots): neither opened nor recorded.
      if (inputs != nullptr && !inputs->Has(f)) continue;
      if (absl::Status s = add(f); !s.ok()) return s;
    }
  }
  return out;
}

}  // namespace megatrain::provenance
