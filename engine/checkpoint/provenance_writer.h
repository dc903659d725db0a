// The provenance record of a checkpoint being written: provenance.json (the
// SHA-256 of its files, the lineage, the link to the previous record) and,
// with a signer, provenance.sig.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/provenance/record.h"

namespace megatrain::engine {

// The link of a new checkpoint of `step` under `root`: the newest record of a
// lower step (a "step-*" directory's provenance.json, else its copy under
// root/lineage), or `origin` when there is none. A lower checkpoint without a
// record gives an kUnrecorded link naming it.
absl::StatusOr<provenance::PreviousLink> FindPreviousLink(const std::string& root, uint64_t step,
                                                          const provenance::PreviousLink& origin);

// Writes `dir`/provenance.json for the checkpoint of `step` whose files are
// `files` (every file of `dir`, with digests), and `dir`/provenance.sig when
// the context has a signer. Without a context the lineage holds only the job
// and the build, and the first link is kUnrecorded.
absl::Status WriteProvenanceFiles(const std::string& dir, const std::string& root, uint64_t step,
                                  const std::string& job_json,
                                  const provenance::ProvenanceContext* context,
                                  std::vector<provenance::FileDigest> files);

}  // namespace megatrain::engine
