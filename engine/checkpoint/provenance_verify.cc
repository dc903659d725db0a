// Offline verification of checkpoints against their provenance records (see provenance_verify.h).
#include "engine/checkpoint/provenance_verify.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/str_cat.h"
#include "engine/checkpoint/checkpoint_directory.h"
#include "engine/checkpoint/durable_file.h"
#include "engine/common/hex.h"
#include "engine/common/safe_files.h"
#include "engine/common/unique_fd.h"
#include "engine/provenance/record.h"
#include "engine/provenance/sha256.h"
#include "engine/provenance/signing_key.h"

namespace megatrain::provenance {
namespace {

namespace fs = std::filesystem;

std::string Short(const std::string& hex) { return hex.substr(0, 16); }

void Add(VerifyReport& report, FindingKind kind, Severity severity, std::string checkpoint,
         std::string file, std::string tensor, std::string message) {
  report.findings.push_back({kind, severity, std::move(file), std::move(tensor),
                             std::move(checkpoint), std::move(message)});
}

// The key every signature must be made with: --pubkey, or else the first one seen.
struct KeyPolicy {
  std::optional<std::string> required_raw;
  std::string chain_key_hex;
};

// Reads a small file; absent -> nullopt with found=false; other errors reported.
std::optional<std::string> ReadRecordFile(const std::string& path, bool* absent,
                                          std::string* error) {
  absl::StatusOr<std::string> text = engine::ReadRegularFile(path, kMaxProvenanceBytes);
  *absent = !text.ok() && absl::IsNotFound(text.status());
  if (!text.ok()) {
    *error = std::string(text.status().message());
    return std::nullopt;
  }
  return *std::move(text);
}

void CheckSignature(const std::string& record_bytes, const std::string& sig_path,
                    const std::string& sig_label, const std::string& checkpoint, KeyPolicy& keys,
                    VerifyReport& report) {
  bool absent = false;
  std::string error;
  std::optional<std::string> text = ReadRecordFile(sig_path, &absent, &error);
  if (!text.has_value()) {
    if (!absent) {
      Add(report, FindingKind::kIoError, Severity::kIoError, checkpoint, sig_label, "", error);
    } else if (keys.required_raw.has_value()) {
      Add(report, FindingKind::kUnsigned, Severity::kFailure, checkpoint, sig_label, "",
          "the record is unsigned, but --pubkey demands a signature by that key");
    } else {
      Add(report, FindingKind::kUnsigned, Severity::kUnsigned, checkpoint, sig_label, "",
          "the record is unsigned");
    }
    return;
  }
  absl::StatusOr<SignatureRecord> sig = ParseSignature(*text, sig_label);
  if (!sig.ok()) {
    Add(report, FindingKind::kBadRecord, Severity::kFailure, checkpoint, sig_label, "",
        std::string(sig.status().message()));
    return;
  }
  const std::string expected_hex =
      keys.required_raw.has_value() ? engine::HexEncode(*keys.required_raw) : keys.chain_key_hex;
  if (!expected_hex.empty() && sig->public_key_hex != expected_hex) {
    Add(report, FindingKind::kWrongKey, Severity::kFailure, checkpoint, sig_label, "",
        absl::StrCat("signed by key ", Short(sig->public_key_hex), "…, not by ",
                     keys.required_raw.has_value() ? "the --pubkey key " : "the chain's key ",
                     Short(expected_hex), "…"));
    return;
  }
  if (keys.chain_key_hex.empty()) keys.chain_key_hex = sig->public_key_hex;
  if (report.signer_public_key_hex.empty()) report.signer_public_key_hex = sig->public_key_hex;
  absl::StatusOr<std::string> raw_key = engine::HexDecode(sig->public_key_hex);
  absl::StatusOr<std::string> raw_sig = engine::HexDecode(sig->signature_hex);
  if (!raw_key.ok() || !raw_sig.ok() || !VerifySignature(*raw_key, record_bytes, *raw_sig)) {
    Add(report, FindingKind::kBadSignature, Severity::kFailure, checkpoint, sig_label, "",
        absl::StrCat("the signature does not match the bytes of ", kProvenanceFileName,
                     " (edited after signing?)"));
  }
}

// Names the tensors of `file` whose bytes differ from the record.
int ReportTensorMismatches(const std::string& path, const FileDigest& recorded,
                           const std::string& checkpoint, VerifyReport& report) {
  const engine::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return 0;
  int mismatches = 0;
  std::vector<uint8_t> chunk(size_t{1} << 20);
  for (const TensorDigest& t : recorded.tensors) {
    Sha256 sha;
    bool short_read = false;
    for (uint64_t at = t.begin; at < t.end && !short_read;) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(chunk.size(), t.end - at));
      const ssize_t n = ::pread(fd.get(), chunk.data(), want, static_cast<off_t>(at));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        short_read = true;
        break;
      }
      sha.Update(absl::MakeConstSpan(chunk.data(), static_cast<size_t>(n)));
      at += static_cast<uint64_t>(n);
    }
    if (short_read) {
      Add(report, FindingKind::kTensorMismatch, Severity::kFailure, checkpoint, recorded.name,
          t.name, absl::StrCat("bytes [", t.begin, ", ", t.end, ") are cut off"));
      ++mismatches;
    } else if (const std::string got = sha.FinalHex(); got != t.sha256_hex) {
      Add(report, FindingKind::kTensorMismatch, Severity::kFailure, checkpoint, recorded.name,
          t.name,
          absl::StrCat("tensor bytes [", t.begin, ", ", t.end, ") have SHA-256 ", Short(got),
                       "…, the record has ", Short(t.sha256_hex), "…"));
      ++mismatches;
    }
  }
  return mismatches;
}

void CheckFiles(const std::string& dir, const ProvenanceRecord& record,
                const std::string& checkpoint, VerifyReport& report) {
  std::map<std::string, const FileDigest*> listed;
  for (const FileDigest& f : record.files) listed[f.name] = &f;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name == kProvenanceFileName || name == kSignatureFileName || listed.contains(name)) {
      continue;
    }
    Add(report, FindingKind::kUnexpectedFile, Severity::kFailure, checkpoint, name, "",
        absl::StrCat("present but not recorded in ", kProvenanceFileName));
  }
  if (ec) {
    Add(report, FindingKind::kIoError, Severity::kIoError, checkpoint, "", "",
        absl::StrCat(dir, ": cannot list: ", ec.message()));
  }
  for (const FileDigest& f : record.files) {
    const std::string path = absl::StrCat(dir, "/", f.name);
    const fs::file_status status = fs::symlink_status(path, ec);
    if (ec || !fs::exists(status)) {
      Add(report, FindingKind::kMissingFile, Severity::kFailure, checkpoint, f.name, "",
          absl::StrCat("missing (recorded with ", f.bytes, " bytes)"));
      continue;
    }
    if (!fs::is_regular_file(status)) {
      Add(report, FindingKind::kFileMismatch, Severity::kFailure, checkpoint, f.name, "",
          "not a regular file");
      continue;
    }
    ++report.files_checked;
    const uint64_t size = fs::file_size(path, ec);
    std::string problem;
    if (!ec && size != f.bytes) {
      problem = absl::StrCat(size, " bytes, the record has ", f.bytes);
    } else {
      absl::StatusOr<std::string> sha = Sha256FileHex(path);
      if (!sha.ok()) {
        Add(report, FindingKind::kIoError, Severity::kIoError, checkpoint, f.name, "",
            std::string(sha.status().message()));
        continue;
      }
      if (*sha != f.sha256_hex) {
        problem =
            absl::StrCat("SHA-256 ", Short(*sha), "…, the record has ", Short(f.sha256_hex), "…");
      }
    }
    if (problem.empty()) continue;
    const int tensors = ReportTensorMismatches(path, f, checkpoint, report);
    Add(report, FindingKind::kFileMismatch, Severity::kFailure, checkpoint, f.name, "",
        f.tensors.empty() ? problem
        : tensors > 0     ? absl::StrCat(problem, " (", tensors, " tensor(s) changed)")
                          : absl::StrCat(problem,
                                         " (no tensor's bytes changed: the header or "
                                             "the file length did)"));
  }
}

// Reads, checks the signature of, and parses one record. Nullopt (with the
// problem reported) when it cannot be used.
struct LoadedRecord {
  std::string bytes;
  ProvenanceRecord record;
};

std::optional<LoadedRecord> LoadRecord(const std::string& json_path, const std::string& sig_path,
                                       const std::string& label, const std::string& sig_label,
                                       const std::string& checkpoint, KeyPolicy& keys,
                                       VerifyReport& report) {
  bool absent = false;
  std::string error;
  std::optional<std::string> bytes = ReadRecordFile(json_path, &absent, &error);
  if (!bytes.has_value()) {
    Add(report, absent ? FindingKind::kBadRecord : FindingKind::kIoError,
        absent ? Severity::kFailure : Severity::kIoError, checkpoint, label, "",
        absent ? "missing: the checkpoint has no provenance record" : error);
    return std::nullopt;
  }
  CheckSignature(*bytes, sig_path, sig_label, checkpoint, keys, report);
  absl::StatusOr<ProvenanceRecord> record = ParseProvenance(*bytes, label);
  if (!record.ok()) {
    Add(report, FindingKind::kBadRecord, Severity::kFailure, checkpoint, label, "",
        std::string(record.status().message()));
    return std::nullopt;
  }
  if (std::optional<uint64_t> step = engine::ParseCheckpointDirName(checkpoint);
      step.has_value() && *step != record->step) {
    Add(report, FindingKind::kBadRecord, Severity::kFailure, checkpoint, label, "",
        absl::StrCat("records step ", record->step, ", but belongs to ", checkpoint));
  }
  return LoadedRecord{*std::move(bytes), *std::move(record)};
}

std::optional<LoadedRecord> CheckCheckpointDir(const std::string& dir, KeyPolicy& keys,
                                               VerifyReport& report) {
  const std::string checkpoint = fs::path(dir).filename().string();
  std::optional<LoadedRecord> loaded = LoadRecord(
      absl::StrCat(dir, "/", kProvenanceFileName), absl::StrCat(dir, "/", kSignatureFileName),
      kProvenanceFileName, kSignatureFileName, checkpoint, keys, report);
  if (!loaded.has_value()) return loaded;
  ++report.checkpoints_checked;
  CheckFiles(dir, loaded->record, checkpoint, report);
  return loaded;
}

void CheckBase(const PreviousLink& origin, const std::string& base_dir,
               const std::string& checkpoint, VerifyReport& report) {
  std::set<std::string> recorded;
  for (const InputFile& f : origin.base_files) {
    recorded.insert(f.path);
    const std::string path = (fs::path(base_dir) / f.path).string();
    absl::StatusOr<std::string> sha = Sha256FileHex(path);
    std::error_code ec;
    const uint64_t size = fs::file_size(path, ec);
    if (!sha.ok()) {
      Add(report, FindingKind::kBaseMismatch, Severity::kFailure, checkpoint, path, "",
          absl::StrCat("base model file: ", std::string(sha.status().message())));
    } else if (*sha != f.sha256_hex || size != f.bytes) {
      Add(report, FindingKind::kBaseMismatch, Severity::kFailure, checkpoint, path, "",
          absl::StrCat("base model file has ", size, " bytes SHA-256 ", Short(*sha),
                       "…; the chain's first record has ", f.bytes, " bytes ", Short(f.sha256_hex),
                       "…"));
    }
  }
  std::error_code ec;
  for (fs::recursive_directory_iterator it(base_dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    const std::string rel = it->path().lexically_relative(base_dir).generic_string();
    if (!recorded.contains(rel)) {
      Add(report, FindingKind::kBaseMismatch, Severity::kFailure, checkpoint, it->path().string(),
          "", "base model file not in the chain's first record");
    }
  }
}

std::string DescribeOrigin(const PreviousLink& link) {
  switch (link.kind) {
    case PreviousLink::Kind::kBaseModel:
      return absl::StrCat("base model ", link.dir_name, " (", link.base_files.size(), " files)");
    case PreviousLink::Kind::kRandomInit:
      return absl::StrCat("random initialisation, seed ", link.seed);
    case PreviousLink::Kind::kUnrecorded:
      return absl::StrCat("an unrecorded origin (", link.reason, ")");
    case PreviousLink::Kind::kCheckpoint:
      break;
  }
  return "a checkpoint";
}

struct RecordLocation {
  std::string dir;          // step-* directory, "" when deleted
  std::string kept_record;  // lineage/step-….provenance.json, "" when none
};

}  // namespace

std::string_view FindingKindName(FindingKind kind) {
  switch (kind) {
    case FindingKind::kFileMismatch:
      return "file_mismatch";
    case FindingKind::kTensorMismatch:
      return "tensor_mismatch";
    case FindingKind::kMissingFile:
      return "missing_file";
    case FindingKind::kUnexpectedFile:
      return "unexpected_file";
    case FindingKind::kBadRecord:
      return "bad_record";
    case FindingKind::kBadSignature:
      return "bad_signature";
    case FindingKind::kWrongKey:
      return "wrong_key";
    case FindingKind::kUnsigned:
      return "unsigned";
    case FindingKind::kChainBreak:
      return "chain_break";
    case FindingKind::kChainMismatch:
      return "chain_mismatch";
    case FindingKind::kBaseMismatch:
      return "base_mismatch";
    case FindingKind::kPruned:
      return "pruned_by_retention";
    case FindingKind::kNote:
      return "note";
    case FindingKind::kIoError:
      break;
  }
  return "io_error";
}

bool VerifyReport::HasSeverity(Severity severity) const {
  for (const VerifyFinding& f : findings) {
    if (f.severity == severity) return true;
  }
  return false;
}

int VerifyReport::ExitCode() const {
  if (HasSeverity(Severity::kFailure)) return kVerifyFailed;
  if (!usage_error.empty() || HasSeverity(Severity::kIoError)) return kVerifyUsage;
  if (HasSeverity(Severity::kUnsigned)) return kVerifyUnsigned;
  return kVerifyOk;
}

VerifyReport VerifyCheckpoint(const std::string& dir,
                              const std::optional<std::string>& public_key_raw) {
  VerifyReport report;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    report.usage_error = absl::StrCat(dir, ": not a directory");
    return report;
  }
  KeyPolicy keys{public_key_raw, ""};
  if (CheckCheckpointDir(dir, keys, report).has_value()) {
    report.chain.push_back(fs::path(dir).filename().string());
  }
  return report;
}

VerifyReport VerifyChain(const std::string& root_or_dir,
                         const std::optional<std::string>& public_key_raw,
                         const std::optional<std::string>& base_dir) {
  VerifyReport report;
  std::error_code ec;
  fs::path given = fs::path(root_or_dir).lexically_normal();
  if (given.filename().empty()) given = given.parent_path();  // a trailing slash
  if (!fs::is_directory(given, ec)) {
    report.usage_error = absl::StrCat(root_or_dir, ": not a directory");
    return report;
  }
  const bool is_checkpoint = fs::exists(given / kProvenanceFileName, ec) ||
                             engine::ParseCheckpointDirName(given.filename().string()).has_value();
  const std::string root =
      is_checkpoint ? (given.has_parent_path() ? given.parent_path().string() : std::string("."))
                    : given.string();

  std::map<uint64_t, RecordLocation> records;
  absl::StatusOr<std::vector<engine::CheckpointListing>> dirs = engine::ListCheckpoints(root);
  absl::StatusOr<std::vector<engine::CheckpointListing>> kept = engine::ListLineageRecords(root);
  if (!dirs.ok() || !kept.ok()) {
    report.usage_error = std::string((!dirs.ok() ? dirs.status() : kept.status()).message());
    return report;
  }
  for (const engine::CheckpointListing& d : *dirs) records[d.step].dir = d.path;
  for (const engine::CheckpointListing& k : *kept) records[k.step].kept_record = k.path;

  std::optional<uint64_t> start;
  if (is_checkpoint) {
    start = engine::ParseCheckpointDirName(given.filename().string());
    if (!start.has_value()) {
      // A checkpoint directory under another name: verify it alone.
      VerifyReport single = VerifyCheckpoint(given.string(), public_key_raw);
      single.findings.push_back({FindingKind::kNote, Severity::kInfo, "", "", "",
                                 "not named step-N: its chain was not followed"});
      return single;
    }
    records[*start].dir = given.string();
  } else if (!records.empty()) {
    start = records.rbegin()->first;
  }
  if (!start.has_value()) {
    report.usage_error = absl::StrCat(root_or_dir, ": no checkpoints (step-*) or lineage records");
    return report;
  }

  KeyPolicy keys{public_key_raw, ""};
  std::set<uint64_t> visited;
  uint64_t step = *start;
  while (true) {
    visited.insert(step);
    const std::string name = engine::CheckpointDirName(step);
    const RecordLocation& where = records[step];
    report.chain.push_back(name);
    std::optional<LoadedRecord> loaded;
    if (!where.dir.empty()) {
      loaded = CheckCheckpointDir(where.dir, keys, report);
    } else {
      const std::string label = absl::StrCat(kLineageDirName, "/", LineageRecordFileName(name));
      loaded = LoadRecord(
          where.kept_record,
          absl::StrCat(root, "/", kLineageDirName, "/", LineageSignatureFileName(name)), label,
          absl::StrCat(kLineageDirName, "/", LineageSignatureFileName(name)), name, keys, report);
      Add(report, FindingKind::kPruned, Severity::kInfo, name, label, "",
          "deleted by retention (keep_last); its kept record was checked, its files cannot be");
    }
    if (!loaded.has_value()) break;
    const PreviousLink& link = loaded->record.previous;
    if (link.kind != PreviousLink::Kind::kCheckpoint) {
      report.origin = DescribeOrigin(link);
      if (link.kind == PreviousLink::Kind::kBaseModel && base_dir.has_value()) {
        CheckBase(link, *base_dir, name, report);
      } else if (link.kind == PreviousLink::Kind::kBaseModel) {
        Add(report, FindingKind::kNote, Severity::kInfo, name, "", "",
            absl::StrCat("the chain starts at ", report.origin,
                         "; its files were not re-hashed (give --base DIR)"));
      } else {
        Add(report, FindingKind::kNote, Severity::kInfo, name, "", "",
            absl::StrCat("the chain starts at ", report.origin));
      }
      break;
    }
    const std::string previous = engine::CheckpointDirName(link.step);
    if (link.step >= step || visited.contains(link.step)) {
      Add(report, FindingKind::kChainBreak, Severity::kFailure, name, kProvenanceFileName, "",
          absl::StrCat(name, " links forward to ", previous));
      break;
    }
    auto next = records.find(link.step);
    std::string next_bytes_path;
    if (next != records.end() && !next->second.dir.empty()) {
      next_bytes_path = absl::StrCat(next->second.dir, "/", kProvenanceFileName);
    } else if (next != records.end()) {
      next_bytes_path = next->second.kept_record;
    }
    bool absent = next_bytes_path.empty();
    std::string error;
    std::optional<std::string> next_bytes;
    if (!absent) next_bytes = ReadRecordFile(next_bytes_path, &absent, &error);
    if (!next_bytes.has_value()) {
      Add(report, FindingKind::kChainBreak, Severity::kFailure, name, kProvenanceFileName, "",
          absent
              ? absl::StrCat(name, " links to ", previous, ", whose record is missing (no ",
                             previous, "/", kProvenanceFileName, " and no ", kLineageDirName, "/",
                             LineageRecordFileName(previous), "): removed outside retention")
              : error);
      break;
    }
    if (const std::string got = Sha256Hex(*next_bytes); got != link.provenance_sha256_hex) {
      Add(report, FindingKind::kChainMismatch, Severity::kFailure, name, kProvenanceFileName, "",
          absl::StrCat(name, " links to ", previous, " with SHA-256 ",
                       Short(link.provenance_sha256_hex), "…, but ", previous,
                       "'s record has SHA-256 ", Short(got), "…"));
    }
    step = link.step;
  }
  for (const auto& [s, where] : records) {
    if (s < *start && !visited.contains(s)) {
      Add(report, FindingKind::kNote, Severity::kInfo, engine::CheckpointDirName(s), "", "",
          absl::StrCat("not on the chain of ", engine::CheckpointDirName(*start)));
    }
  }
  return report;
}

std::string FormatVerifyReport(const VerifyReport& report) {
  std::string out;
  if (!report.usage_error.empty()) return absl::StrCat("error: ", report.usage_error, "\n");
  for (const VerifyFinding& f : report.findings) {
    const char* level = f.severity == Severity::kFailure    ? "FAIL"
                        : f.severity == Severity::kIoError  ? "ERROR"
                        : f.severity == Severity::kUnsigned ? "UNSIGNED"
                                                            : "note";
    std::string where = f.checkpoint;
    if (!f.file.empty()) {
      // A path with a slash (a record kept under lineage/) is relative to the root.
      where = where.empty() || f.file.find('/') != std::string::npos
                  ? f.file
                  : absl::StrCat(where, "/", f.file);
    }
    absl::StrAppend(&out, level, " [", std::string(FindingKindName(f.kind)), "] ", where,
                    f.tensor.empty() ? "" : absl::StrCat(" tensor ", f.tensor), ": ", f.message,
                    "\n");
  }
  const int code = report.ExitCode();
  absl::StrAppend(&out,
                  code == kVerifyOk         ? "VERIFIED"
                  : code == kVerifyUnsigned ? "VERIFIED (UNSIGNED)"
                  : code == kVerifyFailed   ? "FAILED"
                                            : "ERROR",
                  ": ", report.chain.size(), " record(s) in the chain",
                  report.chain.empty() ? "" : absl::StrCat(" (", report.chain.front(), " back)"),
                  ", ", report.checkpoints_checked, " checkpoint(s) with ", report.files_checked,
                  " file(s) re-hashed",
                  report.origin.empty() ? "" : absl::StrCat(", from ", report.origin),
                  report.signer_public_key_hex.empty()
                      ? ", no signature"
                      : absl::StrCat(", signed by ", report.signer_public_key_hex),
                  "\n");
  return out;
}

std::string VerifyReportToJson(const VerifyReport& report) {
  nlohmann::ordered_json findings = nlohmann::ordered_json::array();
  for (const VerifyFinding& f : report.findings) {
    const char* severity = f.severity == Severity::kFailure    ? "failure"
                           : f.severity == Severity::kIoError  ? "io_error"
                           : f.severity == Severity::kUnsigned ? "unsigned"
                                                               : "info";
    findings.push_back({{"kind", std::string(FindingKindName(f.kind))},
                        {"severity", severity},
                        {"checkpoint", f.checkpoint},
                        {"file", f.file},
                        {"tensor", f.tensor},
                        {"message", f.message}});
  }
  const nlohmann::ordered_json j = {{"exit_code", report.ExitCode()},
                                    {"usage_error", report.usage_error},
                                    {"chain", report.chain},
                                    {"checkpoints_checked", report.checkpoints_checked},
                                    {"files_checked", report.files_checked},
                                    {"origin", report.origin},
                                    {"signer_public_key", report.signer_public_key_hex},
                                    {"findings", std::move(findings)}};
  return j.dump(2) + "\n";
}

}  // namespace megatrain::provenance
