// Job lineage and the data check before a continued run (see job_lineage.h).
#include "server/job_lineage.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "engine/data/corpus_files.h"
#include "google/protobuf/util/json_util.h"

namespace megatrain::server {
namespace {

bool IsDataRole(const std::string& role) {
  return role == provenance::kRoleData || role == provenance::kRoleTokenizer;
}

}  // namespace

absl::StatusOr<std::vector<provenance::InputFile>> HashDataInputs(
    const service::ValidatedJob& job) {
  const engine::TrainingRunOptions& o = job.options;
  // The files training reads: each text path listed exactly as the run lists it, in spec order.
  // Fine-tuning data: the chat files (the sample file made from them is the daemon's own output)
  // or the pre-made sample files.
  std::vector<std::string> files = o.token_files;
  if (!job.chat_paths.empty()) {
    files = job.chat_paths;
  } else if (!o.sft_sample_paths.empty()) {
    files = o.sft_sample_paths;
  } else if (o.token_files.empty()) {
    for (const std::string& path : o.text_paths) {
      absl::StatusOr<std::vector<std::string>> listed = engine::ExpandCorpusFiles({path});
      if (!listed.ok()) return listed.status();
      files.insert(files.end(), listed->begin(), listed->end());
    }
  }
  absl::StatusOr<std::vector<provenance::InputFile>> data =
      provenance::HashInputs(provenance::kRoleData, files, o.inputs);
  if (!data.ok()) return data.status();
  // "bytes" is built in; anything else is a tokenizer model file.
  if (o.token_files.empty() && !o.tokenizer.empty() && o.tokenizer != "bytes") {
    absl::StatusOr<std::vector<provenance::InputFile>> tokenizer =
        provenance::HashInputs(provenance::kRoleTokenizer, {o.tokenizer}, o.inputs);
    if (!tokenizer.ok()) return tokenizer.status();
    data->insert(data->end(), tokenizer->begin(), tokenizer->end());
  }
  return data;
}

absl::StatusOr<provenance::Lineage> BuildJobLineage(const v1::JobSpec& spec,
                                                    const service::ValidatedJob& job,
                                                    const std::string& device_kind) {
  provenance::Lineage lineage;
  google::protobuf::util::JsonPrintOptions json;
  json.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(spec, &lineage.job_spec_json, json).ok()) {
    return absl::InternalError("lineage: the job spec does not convert to JSON");
  }
  lineage.build = provenance::CurrentBuild();
  lineage.device_kind = device_kind;
  if (!job.options.init_from_hf_dir.empty()) {
    absl::StatusOr<std::vector<provenance::InputFile>> base = provenance::HashInputs(
        provenance::kRoleBaseModel, {job.options.init_from_hf_dir}, job.options.inputs);
    if (!base.ok()) return base.status();
    lineage.inputs = *std::move(base);
  }
  absl::StatusOr<std::vector<provenance::InputFile>> data = HashDataInputs(job);
  if (!data.ok()) return data.status();
  lineage.inputs.insert(lineage.inputs.end(), data->begin(), data->end());
  return lineage;
}

std::vector<provenance::DataChange> CompareDataInputs(
    const provenance::Lineage& lineage, const std::vector<provenance::InputFile>& current) {
  std::map<std::string, std::string> expected;  // path -> hash ("" = allowed to be gone)
  std::vector<std::string> order;
  for (const provenance::InputFile& f : lineage.inputs) {
    if (!IsDataRole(f.role)) continue;
    if (expected.emplace(f.path, f.sha256_hex).second) order.push_back(f.path);
  }
  for (const provenance::DataChange& c : lineage.data_changes) {  // oldest first: newest wins
    if (expected.find(c.path) == expected.end()) order.push_back(c.path);
    expected[c.path] = c.new_sha256_hex;
  }
  std::map<std::string, std::string> now;
  for (const provenance::InputFile& f : current) {
    now[f.path] = f.sha256_hex;
    if (expected.find(f.path) == expected.end()) order.push_back(f.path);
  }
  std::vector<provenance::DataChange> changes;
  for (const std::string& path : order) {
    auto e = expected.find(path);
    auto n = now.find(path);
    const std::string old_hash = e == expected.end() ? "" : e->second;
    const std::string new_hash = n == now.end() ? "" : n->second;
    if (old_hash == new_hash) continue;
    provenance::DataChange change;
    change.path = path;
    change.old_sha256_hex = old_hash;
    change.new_sha256_hex = new_hash;
    changes.push_back(std::move(change));
  }
  return changes;
}

std::string DescribeDataChanges(const std::vector<provenance::DataChange>& changes) {
  std::string out;
  for (const provenance::DataChange& c : changes) {
    if (!out.empty()) out += "; ";
    if (c.new_sha256_hex.empty()) {
      absl::StrAppend(&out, "data file ", c.path, " is gone (sha256 ", c.old_sha256_hex,
                      " recorded)");
    } else if (c.old_sha256_hex.empty()) {
      absl::StrAppend(&out, "data file ", c.path, " is new (sha256 ", c.new_sha256_hex, ")");
    } else {
      absl::StrAppend(&out, "data file ", c.path,
                      " changed since the job's lineage recorded it: sha256 ", c.old_sha256_hex,
                      " recorded, now ", c.new_sha256_hex);
    }
  }
  return out;
}

}  // namespace megatrain::server
