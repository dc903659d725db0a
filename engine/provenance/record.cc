// Provenance record and signature JSON forms.
#include "engine/provenance/record.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "engine/common/hex.h"
#include "engine/provenance/json_fields.h"
#include "engine/provenance/sha256.h"

namespace megatrain::provenance {
namespace {

namespace fs = std::filesystem;
namespace jf = json_fields;

bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos;
}

nlohmann::ordered_json PreviousToJson(const PreviousLink& p) {
  nlohmann::ordered_json j = {{"kind", std::string(PreviousKindName(p.kind))}};
  switch (p.kind) {
    case PreviousLink::Kind::kCheckpoint:
      j["step"] = p.step;
      j["dir"] = p.dir_name;
      j["provenance_sha256"] = p.provenance_sha256_hex;
      break;
    case PreviousLink::Kind::kBaseModel: {
      j["dir"] = p.dir_name;
      nlohmann::ordered_json files = nlohmann::ordered_json::array();
      for (const InputFile& f : p.base_files) {
        files.push_back({{"path", f.path}, {"sha256", f.sha256_hex}, {"bytes", f.bytes}});
      }
      j["files"] = std::move(files);
      break;
    }
    case PreviousLink::Kind::kRandomInit:
      j["seed"] = p.seed;
      break;
    case PreviousLink::Kind::kUnrecorded:
      j["reason"] = p.reason;
      break;
  }
  return j;
}

absl::StatusOr<PreviousLink> PreviousFromJson(const nlohmann::json& j, const std::string& where) {
  PreviousLink p;
  absl::StatusOr<std::string> kind = jf::String(j, "kind", where);
  if (!kind.ok()) return kind.status();
  if (*kind == "checkpoint") {
    if (absl::Status s = jf::ExactKeys(j, {"kind", "step", "dir", "provenance_sha256"}, where);
        !s.ok()) {
      return s;
    }
    p.kind = PreviousLink::Kind::kCheckpoint;
    absl::StatusOr<uint64_t> step = jf::Unsigned(j, "step", where);
    if (!step.ok()) return step.status();
    p.step = *step;
    absl::StatusOr<std::string> dir = jf::String(j, "dir", where);
    if (!dir.ok()) return dir.status();
    if (!IsPlainFileName(*dir)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".dir: \"", *dir, "\" is not a plain directory name"));
    }
    p.dir_name = *dir;
    absl::StatusOr<std::string> sha = jf::Hex(j, "provenance_sha256", 64, where);
    if (!sha.ok()) return sha.status();
    p.provenance_sha256_hex = *sha;
  } else if (*kind == "base_model") {
    if (absl::Status s = jf::ExactKeys(j, {"kind", "dir", "files"}, where); !s.ok()) return s;
    p.kind = PreviousLink::Kind::kBaseModel;
    absl::StatusOr<std::string> dir = jf::String(j, "dir", where);
    if (!dir.ok()) return dir.status();
    p.dir_name = *dir;
    absl::StatusOr<const nlohmann::json*> files = jf::Array(j, "files", where);
    if (!files.ok()) return files.status();
    for (size_t i = 0; i < (*files)->size(); ++i) {
      const nlohmann::json& f = (**files)[i];
      const std::string fw = absl::StrCat(where, ".files[", i, "]");
      if (absl::Status s = jf::ExactKeys(f, {"path", "sha256", "bytes"}, fw); !s.ok()) return s;
      InputFile in;
      in.role = kRoleBaseModel;
      absl::StatusOr<std::string> path = jf::String(f, "path", fw);
      if (!path.ok()) return path.status();
      in.path = *path;
      absl::StatusOr<std::string> sha = jf::Hex(f, "sha256", 64, fw);
      if (!sha.ok()) return sha.status();
      in.sha256_hex = *sha;
      absl::StatusOr<uint64_t> bytes = jf::Unsigned(f, "bytes", fw);
      if (!bytes.ok()) return bytes.status();
      in.bytes = *bytes;
      p.base_files.push_back(std::move(in));
    }
  } else if (*kind == "random_init") {
    if (absl::Status s = jf::ExactKeys(j, {"kind", "seed"}, where); !s.ok()) return s;
    p.kind = PreviousLink::Kind::kRandomInit;
    absl::StatusOr<uint64_t> seed = jf::Unsigned(j, "seed", where);
    if (!seed.ok()) return seed.status();
    p.seed = *seed;
  } else if (*kind == "unrecorded") {
    if (absl::Status s = jf::ExactKeys(j, {"kind", "reason"}, where); !s.ok()) return s;
    p.kind = PreviousLink::Kind::kUnrecorded;
    absl::StatusOr<std::string> reason = jf::String(j, "reason", where);
    if (!reason.ok()) return reason.status();
    p.reason = *reason;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ".kind: \"", *kind, "\" is not checkpoint, base_model, random_init or unrecorded"));
  }
  return p;
}

absl::StatusOr<FileDigest> FileFromJson(const nlohmann::json& j, const std::string& where) {
  if (absl::Status s = jf::ExactKeys(j, {"name", "bytes", "sha256", "tensors"}, where); !s.ok()) {
    return s;
  }
  FileDigest f;
  absl::StatusOr<std::string> name = jf::String(j, "name", where);
  if (!name.ok()) return name.status();
  if (!IsPlainFileName(*name) || *name == kProvenanceFileName || *name == kSignatureFileName) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".name: \"", *name, "\" is not a recordable file name"));
  }
  f.name = *name;
  absl::StatusOr<uint64_t> bytes = jf::Unsigned(j, "bytes", where);
  if (!bytes.ok()) return bytes.status();
  f.bytes = *bytes;
  absl::StatusOr<std::string> sha = jf::Hex(j, "sha256", 64, where);
  if (!sha.ok()) return sha.status();
  f.sha256_hex = *sha;
  absl::StatusOr<const nlohmann::json*> tensors = jf::Array(j, "tensors", where);
  if (!tensors.ok()) return tensors.status();
  for (size_t i = 0; i < (*tensors)->size(); ++i) {
    const nlohmann::json& t = (**tensors)[i];
    const std::string tw = absl::StrCat(where, ".tensors[", i, "]");
    if (absl::Status s = jf::ExactKeys(t, {"name", "begin", "end", "sha256"}, tw); !s.ok()) {
      return s;
    }
    TensorDigest d;
    absl::StatusOr<std::string> tname = jf::String(t, "name", tw);
    if (!tname.ok()) return tname.status();
    d.name = *tname;
    absl::StatusOr<uint64_t> begin = jf::Unsigned(t, "begin", tw);
    if (!begin.ok()) return begin.status();
    absl::StatusOr<uint64_t> end = jf::Unsigned(t, "end", tw);
    if (!end.ok()) return end.status();
    if (*begin > *end || *end > f.bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          tw, ": range [", *begin, ", ", *end, ") is not inside the file's ", f.bytes, " bytes"));
    }
    d.begin = *begin;
    d.end = *end;
    absl::StatusOr<std::string> tsha = jf::Hex(t, "sha256", 64, tw);
    if (!tsha.ok()) return tsha.status();
    d.sha256_hex = *tsha;
    f.tensors.push_back(std::move(d));
  }
  return f;
}

}  // namespace

std::string_view PreviousKindName(PreviousLink::Kind kind) {
  switch (kind) {
    case PreviousLink::Kind::kCheckpoint:
      return "checkpoint";
    case PreviousLink::Kind::kBaseModel:
      return "base_model";
    case PreviousLink::Kind::kRandomInit:
      return "random_init";
    case PreviousLink::Kind::kUnrecorded:
      break;
  }
  return "unrecorded";
}

PreviousLink BaseModelOrigin(const std::string& base_dir, const std::vector<InputFile>& inputs) {
  PreviousLink p;
  p.kind = PreviousLink::Kind::kBaseModel;
  p.dir_name = base_dir;
  for (const InputFile& f : inputs) {
    if (f.role != kRoleBaseModel) continue;
    InputFile relative = f;
    relative.path = fs::path(f.path).lexically_relative(base_dir).generic_string();
    if (relative.path.empty() || relative.path == ".") {
      relative.path = fs::path(f.path).filename().string();  // base_dir named a single file
    }
    p.base_files.push_back(std::move(relative));
  }
  return p;
}

PreviousLink RandomInitOrigin(uint64_t seed) {
  PreviousLink p;
  p.kind = PreviousLink::Kind::kRandomInit;
  p.seed = seed;
  return p;
}

std::string ProvenanceToJson(const ProvenanceRecord& r) {
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  for (const FileDigest& f : r.files) {
    nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
    for (const TensorDigest& t : f.tensors) {
      tensors.push_back(
          {{"name", t.name}, {"begin", t.begin}, {"end", t.end}, {"sha256", t.sha256_hex}});
    }
    files.push_back({{"name", f.name},
                     {"bytes", f.bytes},
                     {"sha256", f.sha256_hex},
                     {"tensors", std::move(tensors)}});
  }
  const nlohmann::ordered_json j = {{"format", kProvenanceFormatName},
                                    {"version", r.version},
                                    {"step", r.step},
                                    {"files", std::move(files)},
                                    {"lineage", LineageToJsonValue(r.lineage)},
                                    {"previous", PreviousToJson(r.previous)}};
  return j.dump(1) + "\n";
}

absl::StatusOr<ProvenanceRecord> ParseProvenance(std::string_view text, const std::string& source) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(source, ": not JSON"));
  if (absl::Status s =
          jf::ExactKeys(j, {"format", "version", "step", "files", "lineage", "previous"}, source);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::string> format = jf::String(j, "format", source);
  if (!format.ok()) return format.status();
  if (*format != kProvenanceFormatName) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": format \"", *format, "\" is not ", kProvenanceFormatName));
  }
  absl::StatusOr<uint64_t> version = jf::Unsigned(j, "version", source);
  if (!version.ok()) return version.status();
  if (*version != static_cast<uint64_t>(kProvenanceFormatVersion)) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": version ", *version,
                                                   " is not supported (this build reads ",
                                                   kProvenanceFormatVersion, ")"));
  }
  ProvenanceRecord r;
  absl::StatusOr<uint64_t> step = jf::Unsigned(j, "step", source);
  if (!step.ok()) return step.status();
  r.step = *step;
  absl::StatusOr<const nlohmann::json*> files = jf::Array(j, "files", source);
  if (!files.ok()) return files.status();
  for (size_t i = 0; i < (*files)->size(); ++i) {
    absl::StatusOr<FileDigest> f =
        FileFromJson((**files)[i], absl::StrCat(source, ".files[", i, "]"));
    if (!f.ok()) return f.status();
    r.files.push_back(*std::move(f));
  }
  absl::StatusOr<Lineage> lineage = LineageFromJsonValue(j.at("lineage"), source + ".lineage");
  if (!lineage.ok()) return lineage.status();
  r.lineage = *std::move(lineage);
  absl::StatusOr<PreviousLink> previous = PreviousFromJson(j.at("previous"), source + ".previous");
  if (!previous.ok()) return previous.status();
  r.previous = *std::move(previous);
  return r;
}

SignatureRecord SignProvenance(const SigningKey& key, std::string_view provenance_json) {
  return {key.public_key_hex(), engine::HexEncode(key.Sign(provenance_json))};
}

std::string SignatureToJson(const SignatureRecord& s) {
  const nlohmann::ordered_json j = {{"format", kSignatureFormatName},
                                    {"algorithm", "ed25519"},
                                    {"signed_file", kProvenanceFileName},
                                    {"public_key", s.public_key_hex},
                                    {"signature", s.signature_hex}};
  return j.dump(1) + "\n";
}

absl::StatusOr<SignatureRecord> ParseSignature(std::string_view text, const std::string& source) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(source, ": not JSON"));
  if (absl::Status s = jf::ExactKeys(
          j, {"format", "algorithm", "signed_file", "public_key", "signature"}, source);
      !s.ok()) {
    return s;
  }
  for (auto [key, want] :
       {std::pair{"format", kSignatureFormatName}, std::pair{"algorithm", "ed25519"},
        std::pair{"signed_file", kProvenanceFileName}}) {
    absl::StatusOr<std::string> value = jf::String(j, key, source);
    if (!value.ok()) return value.status();
    if (*value != want) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ".", key, ": \"", *value, "\" is not \"", want, "\""));
    }
  }
  SignatureRecord s;
  absl::StatusOr<std::string> key = jf::Hex(j, "public_key", 2 * kEd25519PublicKeyBytes, source);
  if (!key.ok()) return key.status();
  s.public_key_hex = *key;
  absl::StatusOr<std::string> sig = jf::Hex(j, "signature", 2 * kEd25519SignatureBytes, source);
  if (!sig.ok()) return sig.status();
  s.signature_hex = *sig;
  return s;
}

std::string LineageRecordFileName(const std::string& checkpoint_dir_name) {
  return checkpoint_dir_name + ".provenance.json";
}

std::string LineageSignatureFileName(const std::string& checkpoint_dir_name) {
  return checkpoint_dir_name + ".provenance.sig";
}

}  // namespace megatrain::provenance
