// Offline verification of checkpoints against their provenance records: every
// file's and tensor's SHA-256, the Ed25519 signatures, and the chain of
// records from the newest checkpoint back to the base model.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace megatrain::provenance {

enum class FindingKind {
  kFileMismatch,    // size or SHA-256 differs (bytes outside every tensor when `tensor` is empty)
  kTensorMismatch,  // a safetensors tensor's bytes differ
  kMissingFile,     // recorded but absent
  kUnexpectedFile,  // present but not recorded
  kBadRecord,       // provenance.json or .sig missing, unreadable, malformed or for another step
  kBadSignature,    // the signature does not match provenance.json's bytes
  kWrongKey,        // signed by another key than --pubkey (or than the chain's newest record)
  kUnsigned,        // no provenance.sig
  kChainBreak,      // a record links to a record that does not exist
  kChainMismatch,   // a record links to a record whose bytes differ from the link's SHA-256
  kBaseMismatch,    // a base model file differs from the chain's first record
  kPruned,          // (info) a checkpoint deleted by retention; its kept record was checked
  kNote,            // (info) how the chain ends, records off the chain
  kIoError,         // a file could not be read for a reason other than absence
};

enum class Severity { kInfo, kUnsigned, kFailure, kIoError };

std::string_view FindingKindName(FindingKind kind);

struct VerifyFinding {
  FindingKind kind = FindingKind::kNote;
  Severity severity = Severity::kInfo;
  std::string file;        // path relative to the checkpoint (or the record's path)
  std::string tensor;      // safetensors tensor name, when the finding is about one
  std::string checkpoint;  // "step-…" directory name the finding belongs to
  std::string message;
};

// Exit codes of `megatrain verify` (docs/provenance.md).
inline constexpr int kVerifyOk = 0;        // verified and signed by the given or embedded key
inline constexpr int kVerifyFailed = 1;    // any mismatch, break, bad or foreign signature
inline constexpr int kVerifyUsage = 2;     // usage or I/O error
// Verified, but some record is unsigned. Not 3: the CLI's 3 is "daemon unreachable"
// (client/exit_codes.h, kExitUnsigned).
inline constexpr int kVerifyUnsigned = 6;

struct VerifyReport {
  std::vector<VerifyFinding> findings;
  std::vector<std::string> chain;  // records visited, newest first ("step-…")
  int checkpoints_checked = 0;     // directories whose files were re-hashed
  int files_checked = 0;
  std::string signer_public_key_hex;  // of the signed records ("" when none)
  std::string origin;                 // how the chain ends, in words
  std::string usage_error;            // non-empty: nothing could be verified

  bool HasSeverity(Severity severity) const;
  // kVerifyFailed if any failure, else kVerifyUsage for an I/O or usage
  // error, else kVerifyUnsigned if any record is unsigned, else kVerifyOk.
  int ExitCode() const;
};

// Verifies one checkpoint directory: its provenance.json and signature, and
// every file (and tensor) against the record. `public_key_raw` (32 bytes)
// demands a signature by that key; without it the embedded key is used.
VerifyReport VerifyCheckpoint(const std::string& dir,
                              const std::optional<std::string>& public_key_raw);

// Verifies the chain that ends at `root_or_dir` (a checkpoint directory, or a
// checkpoint root: then its newest checkpoint): that checkpoint completely,
// then each previous record in turn (a checkpoint directory completely, a
// record kept by retention under lineage/ by its signature) down to the
// origin; with `base_dir`, the base model's files are re-hashed against the
// first record.
VerifyReport VerifyChain(const std::string& root_or_dir,
                         const std::optional<std::string>& public_key_raw,
                         const std::optional<std::string>& base_dir = std::nullopt);

// One line per finding (info included) and a summary line.
std::string FormatVerifyReport(const VerifyReport& report);
// The report as JSON (findings, chain, summary, exit_code).
std::string VerifyReportToJson(const VerifyReport& report);

}  // namespace megatrain::provenance
