// TrainerService (see trainer_service.h).
#include "server/trainer_service.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "service/job_spec_validation.h"

namespace megatrain::server {
namespace {

// Handler threads yield the CPU to training under contention (nice is per thread on Linux):
// polling clients must not slow the job down. Done once per gRPC thread.
void DeprioritizeHandlerThread() {
  thread_local bool done = false;
  if (done) return;
  done = true;
  // SCHED_IDLE: a handler never preempts the training threads on wakeup (with
  // two BLAS threads on two cores, one preempted thread stalls both at the
  // next barrier); it runs in their gaps. Nice 19 if the policy is refused.
  sched_param param{};
  if (sched_setscheduler(static_cast<pid_t>(syscall(SYS_gettid)), SCHED_IDLE, &param) != 0) {
    setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
  }
}

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share their numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

std::string CodeName(absl::StatusCode code) { return absl::StatusCodeToString(code); }

}  // namespace

absl::Status ValidateJobId(const std::string& id) {
  if (id.empty()) return absl::InvalidArgumentError("id: required");
  if (id.size() > 64) {
    return absl::InvalidArgumentError(absl::StrCat("id: ", id.size(), " bytes, more than 64"));
  }
  for (char c : id) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_')) {
      return absl::InvalidArgumentError("id: only letters, digits, '-' and '_' are allowed");
    }
  }
  return absl::OkStatus();
}

TrainerService::TrainerService(const service::DaemonSettings& settings,
                               const service::PathPolicy& paths, JobRunner& runner,
                               DaemonMetrics* metrics, StructuredLog& log, const JobAccess& access,
                               std::string public_key_hex)
    : settings_(settings),
      paths_(paths),
      runner_(runner),
      metrics_(metrics),
      log_(log),
      access_(access),
      public_key_hex_(std::move(public_key_hex)) {}

grpc::Status TrainerService::Finish(const char* method, const absl::Status& status) {
  const std::string code = CodeName(status.code());
  if (metrics_ != nullptr) metrics_->CountRpc(method, code);
  if (!status.ok()) {
    log_.Event("rpc_error",
               {{"method", method}, {"code", code}, {"message", std::string(status.message())}});
  }
  return ToGrpc(status);
}

absl::StatusOr<service::ValidatedJob> TrainerService::Validate(const v1::JobSpec& spec) const {
  return service::ValidateJobSpec(spec, settings_, paths_);
}

grpc::Status TrainerService::SubmitJob(grpc::ServerContext* context,
                                       const v1::SubmitJobRequest* request, v1::Job* response) {
  DeprioritizeHandlerThread();
  if (!request->has_spec()) {
    return Finish("SubmitJob", absl::InvalidArgumentError("spec: required"));
  }
  absl::StatusOr<service::ValidatedJob> job = Validate(request->spec());
  if (!job.ok()) return Finish("SubmitJob", job.status());
  const Caller caller = access_.Identify(context->peer());
  absl::StatusOr<v1::Job> submitted = runner_.Submit(request->spec(), std::move(*job), caller.uid);
  if (submitted.ok()) *response = *submitted;
  return Finish("SubmitJob", submitted.status());
}

grpc::Status TrainerService::GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                                    v1::Job* response) {
  DeprioritizeHandlerThread();
  if (absl::Status s = ValidateJobId(request->id()); !s.ok()) return Finish("GetJob", s);
  absl::StatusOr<v1::Job> job = runner_.Get(request->id());
  if (job.ok()) *response = *job;
  return Finish("GetJob", job.status());
}

grpc::Status TrainerService::ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* request,
                                      v1::ListJobsResponse* response) {
  DeprioritizeHandlerThread();
  if (request->states_size() > 16) {
    return Finish("ListJobs", absl::InvalidArgumentError(absl::StrCat(
                                  "states: ", request->states_size(), " entries, more than 16")));
  }
  std::vector<v1::JobState> states;
  for (int i = 0; i < request->states_size(); ++i) {
    const int s = request->states(i);
    if (s < v1::QUEUED || s > v1::CANCELLED) {
      return Finish("ListJobs", absl::InvalidArgumentError(
                                    absl::StrCat("states[", i, "]: ", s, " is not a job state")));
    }
    states.push_back(static_cast<v1::JobState>(s));
  }
  if (request->page_size() > kMaxListPageSize) {
    return Finish("ListJobs",
                  absl::InvalidArgumentError(absl::StrCat("page_size: ", request->page_size(),
                                                          " is more than ", kMaxListPageSize)));
  }
  int64_t after = 0;  // the token is the last listed job's sequence number
  if (!request->page_token().empty() &&
      (request->page_token().size() > 20 || !absl::SimpleAtoi(request->page_token(), &after) ||
       after <= 0)) {
    return Finish("ListJobs", absl::InvalidArgumentError(
                                  absl::StrCat("page_token: '", request->page_token().substr(0, 32),
                                               "' is not a next_page_token of this daemon")));
  }
  const size_t limit = request->page_size() == 0 ? kMaxListPageSize : request->page_size();
  int64_t next_after = 0;
  for (v1::Job& job : runner_.ListPage(states, after, limit, &next_after)) {
    *response->add_jobs() = std::move(job);
  }
  if (next_after != 0) response->set_next_page_token(absl::StrCat(next_after));
  return Finish("ListJobs", absl::OkStatus());
}

grpc::Status TrainerService::PurgeJobs(grpc::ServerContext* context,
                                       const v1::PurgeJobsRequest* request,
                                       v1::PurgeJobsResponse* response) {
  DeprioritizeHandlerThread();
  if (absl::Status s = access_.AuthorizeAdmin(access_.Identify(context->peer()), "purge");
      !s.ok()) {
    return Finish("PurgeJobs", s);
  }
  if (request->finished_before_unix_ms() <= 0) {
    return Finish("PurgeJobs", absl::InvalidArgumentError(absl::StrCat(
                                   "finished_before_unix_ms: ", request->finished_before_unix_ms(),
                                   " is not a time (milliseconds since 1970, > 0)")));
  }
  absl::StatusOr<std::vector<std::string>> purged =
      runner_.Purge(request->finished_before_unix_ms());
  if (purged.ok()) {
    for (const std::string& id : *purged) response->add_purged_ids(id);
  }
  return Finish("PurgeJobs", purged.status());
}

grpc::Status TrainerService::WatchJob(grpc::ServerContext* context,
                                      const v1::WatchJobRequest* request,
                                      grpc::ServerWriter<v1::ProgressEvent>* writer) {
  DeprioritizeHandlerThread();
  if (absl::Status s = ValidateJobId(request->id()); !s.ok()) return Finish("WatchJob", s);
  uint64_t version = 0;
  uint64_t eval_replies_seen = 0;
  while (!context->IsCancelled()) {
    v1::Job job;
    std::string message;
    absl::StatusOr<bool> changed =
        runner_.WaitForChange(request->id(), &version, absl::Milliseconds(500), &job, &message);
    if (!changed.ok()) return Finish("WatchJob", changed.status());
    if (!*changed) continue;
    // Each eval reply as its own event, before the job's latest state: several come at once.
    bool written = true;
    for (const v1::ProgressEvent& reply :
         runner_.EvalReplyEventsSince(request->id(), &eval_replies_seen)) {
      written = written && writer->Write(reply);
    }
    if (!written) break;
    v1::ProgressEvent event;
    event.set_job_id(job.id());
    event.set_state(job.state());
    *event.mutable_progress() = job.progress();
    event.set_message(message.empty() && job.state() == v1::FAILED ? job.failure_reason()
                                                                   : message);
    event.set_unix_ms(absl::ToUnixMillis(absl::Now()));
    if (!writer->Write(event)) break;
    if (job.state() == v1::SUCCEEDED || job.state() == v1::FAILED || job.state() == v1::CANCELLED) {
      return Finish("WatchJob", absl::OkStatus());
    }
  }
  return Finish("WatchJob", absl::CancelledError("watch ended: client went away or the daemon is "
                                                 "shutting down"));
}

grpc::Status TrainerService::CancelJob(grpc::ServerContext* context, const v1::JobRef* request,
                                       v1::Job* response) {
  DeprioritizeHandlerThread();
  if (absl::Status s = ValidateJobId(request->id()); !s.ok()) return Finish("CancelJob", s);
  if (absl::Status s =
          access_.AuthorizeJob(access_.Identify(context->peer()), request->id(), "cancel");
      !s.ok()) {
    return Finish("CancelJob", s);
  }
  absl::StatusOr<v1::Job> job = runner_.Cancel(request->id());
  if (job.ok()) *response = *job;
  return Finish("CancelJob", job.status());
}

grpc::Status TrainerService::PauseJob(grpc::ServerContext* context, const v1::JobRef* request,
                                      v1::Job* response) {
  DeprioritizeHandlerThread();
  if (absl::Status s = ValidateJobId(request->id()); !s.ok()) return Finish("PauseJob", s);
  if (absl::Status s =
          access_.AuthorizeJob(access_.Identify(context->peer()), request->id(), "pause");
      !s.ok()) {
    return Finish("PauseJob", s);
  }
  absl::StatusOr<v1::Job> job = runner_.Pause(request->id());
  if (job.ok()) *response = *job;
  return Finish("PauseJob", job.status());
}

// Re-hashes the job's data files on this handler thread (see JobRunner::Resume).
grpc::Status TrainerService::ResumeJob(grpc::ServerContext* context,
                                       const v1::ResumeJobRequest* request, v1::Job* response) {
  DeprioritizeHandlerThread();
  if (absl::Status s = ValidateJobId(request->id()); !s.ok()) return Finish("ResumeJob", s);
  if (absl::Status s =
          access_.AuthorizeJob(access_.Identify(context->peer()), request->id(), "resume");
      !s.ok()) {
    return Finish("ResumeJob", s);
  }
  absl::StatusOr<v1::Job> job = runner_.Resume(request->id(), request->allow_data_change());
  if (job.ok()) *response = *job;
  return Finish("ResumeJob", job.status());
}

// Waits on the handler thread for the runner's commit; the runner never blocks on it.
grpc::Status TrainerService::Checkpoint(grpc::ServerContext* context, const v1::JobRef* request,
                                        v1::CheckpointRecord* response) {
  DeprioritizeHandlerThread();
  if (absl::Status s = ValidateJobId(request->id()); !s.ok()) return Finish("Checkpoint", s);
  if (absl::Status s =
          access_.AuthorizeJob(access_.Identify(context->peer()), request->id(), "checkpoint");
      !s.ok()) {
    return Finish("Checkpoint", s);
  }
  absl::StatusOr<v1::CheckpointRecord> record =
      runner_.CheckpointNow(request->id(), kCheckpointRpcTimeout);
  if (record.ok()) *response = *record;
  return Finish("Checkpoint", record.status());
}

grpc::Status TrainerService::ListCheckpoints(grpc::ServerContext*, const v1::JobRef* request,
                                             v1::ListCheckpointsResponse* response) {
  DeprioritizeHandlerThread();
  if (absl::Status s = ValidateJobId(request->id()); !s.ok()) return Finish("ListCheckpoints", s);
  absl::StatusOr<std::vector<v1::CheckpointRecord>> records = runner_.Checkpoints(request->id());
  if (records.ok()) {
    for (v1::CheckpointRecord& r : *records) *response->add_checkpoints() = std::move(r);
  }
  return Finish("ListCheckpoints", records.status());
}

grpc::Status TrainerService::GetJobHistory(grpc::ServerContext*, const v1::JobRef* request,
                                           v1::JobHistory* response) {
  DeprioritizeHandlerThread();
  if (absl::Status s = ValidateJobId(request->id()); !s.ok()) return Finish("GetJobHistory", s);
  absl::StatusOr<v1::JobHistory> history = runner_.History(request->id());
  if (history.ok()) *response = *std::move(history);
  return Finish("GetJobHistory", history.status());
}

grpc::Status TrainerService::Plan(grpc::ServerContext*, const v1::JobSpec* request,
                                  v1::PlanResponse* response) {
  DeprioritizeHandlerThread();
  absl::StatusOr<service::ValidatedJob> job = Validate(*request);
  if (job.ok()) *response = job->plan;
  return Finish("Plan", job.status());
}

grpc::Status TrainerService::GetDaemonStatus(grpc::ServerContext*,
                                             const v1::GetDaemonStatusRequest*,
                                             v1::DaemonStatus* response) {
  DeprioritizeHandlerThread();
  *response = BuildDaemonStatus(settings_, runner_, public_key_hex_);
  return Finish("GetDaemonStatus", absl::OkStatus());
}

grpc::Status TrainerService::GetAuditLog(grpc::ServerContext* context,
                                         const v1::GetAuditLogRequest* request,
                                         v1::AuditLog* response) {
  DeprioritizeHandlerThread();
  if (absl::Status s = ValidateJobId(request->job_id()); !s.ok()) {
    return Finish("GetAuditLog", absl::InvalidArgumentError(absl::StrCat("job_", s.message())));
  }
  if (absl::Status s =
          access_.AuthorizeJob(access_.Identify(context->peer()), request->job_id(), "audit");
      !s.ok()) {
    return Finish("GetAuditLog", s);
  }
  absl::StatusOr<v1::AuditLog> log = runner_.Audit(request->job_id());
  if (log.ok()) *response = *std::move(log);
  return Finish("GetAuditLog", log.status());
}

}  // namespace megatrain::server
