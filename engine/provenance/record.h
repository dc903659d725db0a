// The provenance record of a checkpoint (provenance.json): the SHA-256 of
// every file (and of every tensor of its safetensors files), the job's
// lineage, and the link to the previous record or to the base model; and its
// detached Ed25519 signature (provenance.sig).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/provenance/lineage.h"
#include "engine/provenance/signing_key.h"

namespace megatrain::provenance {

inline constexpr int kProvenanceFormatVersion = 1;
inline constexpr char kProvenanceFormatName[] = "megatrain-provenance";
inline constexpr char kSignatureFormatName[] = "megatrain-provenance-signature";
inline constexpr char kProvenanceFileName[] = "provenance.json";
inline constexpr char kSignatureFileName[] = "provenance.sig";
// Under a checkpoint root: the records of checkpoints deleted by retention.
inline constexpr char kLineageDirName[] = "lineage";
inline constexpr uint64_t kMaxProvenanceBytes = uint64_t{64} << 20;

// One tensor's data bytes [begin, end) as absolute offsets in its file.
struct TensorDigest {
  std::string name;
  uint64_t begin = 0;
  uint64_t end = 0;
  std::string sha256_hex;
  bool operator==(const TensorDigest&) const = default;
};

struct FileDigest {
  std::string name;  // a plain file name inside the checkpoint directory
  uint64_t bytes = 0;
  std::string sha256_hex;
  std::vector<TensorDigest> tensors;  // safetensors files only
  bool operator==(const FileDigest&) const = default;
};

// Where a checkpoint's state came from.
struct PreviousLink {
  enum class Kind {
    kCheckpoint,  // the previous checkpoint of the chain
    kBaseModel,   // the first checkpoint of a run started from a model directory
    kRandomInit,  // the first checkpoint of a run started from random weights
    kUnrecorded,  // the writer was not told (or the previous checkpoint had no record)
  };
  Kind kind = Kind::kUnrecorded;
  uint64_t step = 0;                  // kCheckpoint
  std::string dir_name;               // kCheckpoint: "step-…"; kBaseModel: the directory as given
  std::string provenance_sha256_hex;  // kCheckpoint: SHA-256 of its provenance.json bytes
  std::vector<InputFile> base_files;  // kBaseModel: paths relative to dir_name
  uint64_t seed = 0;                  // kRandomInit
  std::string reason;                 // kUnrecorded
  bool operator==(const PreviousLink&) const = default;
};

std::string_view PreviousKindName(PreviousLink::Kind kind);

// The origin of a run started from the model directory `base_dir`: its files
// among `inputs` (role base_model, paths under base_dir), made relative.
PreviousLink BaseModelOrigin(const std::string& base_dir, const std::vector<InputFile>& inputs);
PreviousLink RandomInitOrigin(uint64_t seed);

struct ProvenanceRecord {
  int version = kProvenanceFormatVersion;
  uint64_t step = 0;
  std::vector<FileDigest> files;  // every file of the directory but provenance.json/.sig
  Lineage lineage;
  PreviousLink previous;
  bool operator==(const ProvenanceRecord&) const = default;
};

std::string ProvenanceToJson(const ProvenanceRecord& record);
// Strict: unknown or missing keys, another format or version are
// InvalidArgument errors starting with `source`.
absl::StatusOr<ProvenanceRecord> ParseProvenance(std::string_view text, const std::string& source);

// provenance.sig: the signer's public key and the Ed25519 signature of the
// exact bytes of provenance.json.
struct SignatureRecord {
  std::string public_key_hex;
  std::string signature_hex;
};
SignatureRecord SignProvenance(const SigningKey& key, std::string_view provenance_json);
std::string SignatureToJson(const SignatureRecord& signature);
absl::StatusOr<SignatureRecord> ParseSignature(std::string_view text, const std::string& source);

// What a checkpoint writer needs to know to write a record. Immutable once
// built; shared with the background writer.
struct ProvenanceContext {
  Lineage lineage;
  PreviousLink origin;                       // the previous link of the first checkpoint
  std::shared_ptr<const SigningKey> signer;  // null: records are written unsigned
};

// "<step dir name>.provenance.json" / ".provenance.sig" inside <root>/lineage.
std::string LineageRecordFileName(const std::string& checkpoint_dir_name);
std::string LineageSignatureFileName(const std::string& checkpoint_dir_name);

}  // namespace megatrain::provenance
