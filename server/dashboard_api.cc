// DashboardApi (see dashboard_api.h).
#include "server/dashboard_api.h"

#include <unistd.h>

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "engine/checkpoint/manifest.h"
#include "engine/provenance/sha256.h"
#include "google/protobuf/util/json_util.h"
#include "server/daemon_status.h"
#include "server/dashboard_assets.h"
#include "server/trainer_service.h"

namespace megatrain::server {
namespace {

constexpr char kApiPrefix[] = "/api/jobs/";

// The proto JSON mapping with every field present (zeros too) and the .proto's field names.
std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  if (!google::protobuf::util::MessageToJsonString(message, &out, options).ok()) return "null";
  return out;
}

std::string JsonString(absl::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      absl::StrAppend(&out, "\\", std::string(1, c));
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppend(&out, " ");
    } else {
      out.push_back(c);
    }
  }
  return out + "\"";
}

HttpReply Json(std::string body, std::string status = "200 OK") {
  HttpReply reply;
  reply.status = std::move(status);
  reply.body = std::move(body);
  reply.headers = {{"Cache-Control", "no-store"}, {"X-Content-Type-Options", "nosniff"}};
  return reply;
}

HttpReply Error(const absl::Status& s) {
  std::string status = "500 Internal Server Error";
  if (s.code() == absl::StatusCode::kNotFound) status = "404 Not Found";
  if (s.code() == absl::StatusCode::kInvalidArgument) status = "400 Bad Request";
  return Json(absl::StrCat("{\"error\":", JsonString(s.message()), "}"), std::move(status));
}

// The job without its paths (dashboard_api.h).
v1::Job Redacted(v1::Job job) {
  v1::JobSpec& spec = *job.mutable_spec();
  spec.clear_model();
  spec.clear_data();
  spec.clear_output_dir();
  spec.mutable_memory()->clear_nvme_dir();
  job.clear_resolved_output_dir();
  job.clear_submitter_uid();
  return job;
}

// The quick check of a checkpoint (dashboard_api.h): its manifest hashed again against the
// hash recorded at commit.
const char* CheckManifest(const v1::CheckpointRecord& record) {
  if (record.manifest_sha256().empty()) return "not_hashed";
  absl::StatusOr<std::string> sha =
      provenance::Sha256FileHex(record.path() + "/" + engine::kManifestFileName);
  if (!sha.ok()) return "missing";
  return *sha == record.manifest_sha256() ? "manifest_matches" : "manifest_changed";
}

// Bytes of physical RAM (0 when unknown).
uint64_t PhysicalRamBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

}  // namespace

std::optional<HttpReply> DashboardApi::Handle(absl::string_view target,
                                              absl::string_view host) const {
  if (!HostAllowed(host, host_names_)) {
    HttpReply refused = Json("{\"error\":\"Host is not a name of this server\"}", "403 Forbidden");
    return refused;
  }
  const absl::string_view path = target.substr(0, target.find('?'));
  if (path == "/api/events") {
    const size_t query = target.find('?');
    return Events(query == absl::string_view::npos ? std::string()
                                                   : FormValue(target.substr(query + 1), "job"));
  }
  if (path == "/api/daemon") return Daemon();
  if (path == "/api/jobs") return Jobs();
  if (absl::StartsWith(path, kApiPrefix))
    return Job(std::string(path.substr(sizeof(kApiPrefix) - 1)));
  const absl::string_view name = path == "/" ? "index.html" : absl::StripPrefix(path, "/");
  const std::optional<DashboardAsset> asset = FindDashboardAsset(name);
  if (!asset.has_value()) return std::nullopt;
  HttpReply reply;
  reply.content_type = std::string(asset->content_type);
  reply.body = std::string(asset->body);
  reply.headers = {{"Cache-Control", "no-cache"},
                   {"X-Content-Type-Options", "nosniff"},
                   {"X-Frame-Options", "DENY"},
                   {"Content-Security-Policy",
                    "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"}};
  return reply;
}

HttpReply DashboardApi::Daemon() const {
  v1::DaemonStatus status = BuildDaemonStatus(settings_, runner_, public_key_hex_);
  v1::TierUsage* ram = status.add_memory();  // the gRPC answer has device and pinned only
  ram->set_tier("ram");
  ram->set_budget_bytes(settings_.max_ram_bytes != 0 ? settings_.max_ram_bytes
                                                     : PhysicalRamBytes());
  if (!status.running_job_id().empty()) {
    if (absl::StatusOr<v1::Job> job = runner_.Get(status.running_job_id()); job.ok()) {
      for (const v1::TierUsage& t : job->progress().memory()) {
        if (t.tier() == "ram") ram->set_bytes(t.bytes());
      }
    }
  }
  return Json(ToJson(status));
}

HttpReply DashboardApi::Jobs() const {
  std::vector<v1::Job> jobs = runner_.List({});
  v1::ListJobsResponse response;
  const size_t first = jobs.size() > kMaxDashboardJobs ? jobs.size() - kMaxDashboardJobs : 0;
  for (size_t i = first; i < jobs.size(); ++i) *response.add_jobs() = Redacted(std::move(jobs[i]));
  return Json(ToJson(response));
}

HttpReply DashboardApi::Events(std::string job_id) const {
  if (!job_id.empty()) {
    if (absl::Status s = ValidateJobId(job_id); !s.ok()) return Error(s);
  }
  HttpReply reply;
  reply.content_type = "text/event-stream; charset=utf-8";
  reply.headers = {{"Cache-Control", "no-store"}, {"X-Content-Type-Options", "nosniff"}};
  reply.stream = [this, job_id = std::move(job_id)](EventSink& sink) {
    uint64_t generation = 0;  // 0: the first wait returns at once, so the first event is sent
    absl::Time last_sent = absl::InfinitePast();
    while (sink.Open()) {
      // Bounded so a closed client or a stopping server is noticed within a second.
      absl::StatusOr<bool> changed = runner_.WaitForAnyChange(&generation, absl::Seconds(1));
      if (!changed.ok()) return;  // the runner stops
      if (*changed) {
        // A fast job steps far more often than a page redraws: at most one event per
        // kMinEventInterval, the changes meanwhile coalesced into it.
        const absl::Duration since = absl::Now() - last_sent;
        if (since < kMinEventInterval) absl::SleepFor(kMinEventInterval - since);
        if (!sink.Open()) return;
        if (!sink.Send(EventsText(job_id))) return;
        last_sent = absl::Now();
      } else if (absl::Now() - last_sent >= kEventKeepalive) {
        if (!sink.Send(": keepalive\n\n")) return;
        last_sent = absl::Now();
      }
    }
  };
  return reply;
}

std::string DashboardApi::EventsText(const std::string& job_id) const {
  // Proto JSON without whitespace is one line; "data:" lines must not hold a newline.
  std::string text = absl::StrCat("event: jobs\ndata: {\"daemon\":", Daemon().body,
                                  ",\"list\":", Jobs().body, "}\n\n");
  if (!job_id.empty()) {
    const HttpReply job = Job(job_id);
    absl::StrAppend(&text, "event: ", job.status == "200 OK" ? "job" : "job_error",
                    "\ndata: ", job.body, "\n\n");
  }
  return text;
}

HttpReply DashboardApi::Job(const std::string& id) const {
  if (absl::Status s = ValidateJobId(id); !s.ok()) return Error(s);
  absl::StatusOr<v1::Job> job = runner_.Get(id);
  if (!job.ok()) return Error(job.status());
  absl::StatusOr<v1::JobHistory> history = runner_.History(id);
  if (!history.ok()) return Error(history.status());
  absl::StatusOr<std::vector<v1::CheckpointRecord>> records = runner_.Checkpoints(id);
  if (!records.ok()) return Error(records.status());
  v1::ListCheckpointsResponse checkpoints;
  std::string checks;  // one per record, in order; the newest kCheckedCheckpoints are checked
  for (size_t i = 0; i < records->size(); ++i) {
    const bool check = i + kCheckedCheckpoints >= records->size();
    absl::StrAppend(&checks, i == 0 ? "" : ",", "\"",
                    check ? CheckManifest((*records)[i]) : "not_checked", "\"");
    *checkpoints.add_checkpoints() = std::move((*records)[i]);
  }
  return Json(absl::StrCat(
      "{\"job\":", ToJson(Redacted(*std::move(job))), ",\"history\":", ToJson(*history),
      ",\"checkpoints\":", ToJson(checkpoints), ",\"checkpoint_checks\":[", checks, "]}"));
}

}  // namespace megatrain::server
