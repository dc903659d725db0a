// TrainerService: the megatrain.v1.Trainer gRPC handlers. Each validates its request, hands work
// to the JobRunner and maps absl codes 1:1 onto gRPC codes; every call is counted and logged.
#pragma once

#include <string>

#include "absl/time/time.h"
#include "proto/megatrain.grpc.pb.h"
#include "proto/rpc_waits.h"
#include "server/daemon_status.h"
#include "server/job_access.h"
#include "server/job_runner.h"
#include "server/metrics.h"
#include "server/structured_log.h"
#include "service/daemon_config.h"
#include "service/path_policy.h"

namespace megatrain::server {

// ListJobs answers at most this many jobs per page (page_size 0 = this).
inline constexpr uint32_t kMaxListPageSize = 1000;

// How long a Checkpoint RPC waits (the CLI's deadline outlasts it): proto/rpc_waits.h.
using v1::kCheckpointRpcTimeout;

class TrainerService final : public v1::Trainer::Service {
 public:
  // `metrics` may be null. Everything passed in outlives the service. `public_key_hex` is the
  // daemon's signing key, reported by GetDaemonStatus.
  // `access` decides who may change a job (issue 16, point 12).
  TrainerService(const service::DaemonSettings& settings, const service::PathPolicy& paths,
                 JobRunner& runner, DaemonMetrics* metrics, StructuredLog& log,
                 const JobAccess& access, std::string public_key_hex = "");

  grpc::Status SubmitJob(grpc::ServerContext* context, const v1::SubmitJobRequest* request,
                         v1::Job* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::ProgressEvent>* writer) override;
  grpc::Status CancelJob(grpc::ServerContext* context, const v1::JobRef* request,
                         v1::Job* response) override;
  grpc::Status PauseJob(grpc::ServerContext* context, const v1::JobRef* request,
                        v1::Job* response) override;
  grpc::Status ResumeJob(grpc::ServerContext* context, const v1::ResumeJobRequest* request,
                         v1::Job* response) override;
  grpc::Status Checkpoint(grpc::ServerContext* context, const v1::JobRef* request,
                          v1::CheckpointRecord* response) override;
  grpc::Status ListCheckpoints(grpc::ServerContext* context, const v1::JobRef* request,
                               v1::ListCheckpointsResponse* response) override;
  grpc::Status Plan(grpc::ServerContext* context, const v1::JobSpec* request,
                    v1::PlanResponse* response) override;
  grpc::Status GetJobHistory(grpc::ServerContext* context, const v1::JobRef* request,
                             v1::JobHistory* response) override;
  grpc::Status GetDaemonStatus(grpc::ServerContext* context,
                               const v1::GetDaemonStatusRequest* request,
                               v1::DaemonStatus* response) override;
  grpc::Status PurgeJobs(grpc::ServerContext* context, const v1::PurgeJobsRequest* request,
                         v1::PurgeJobsResponse* response) override;
  grpc::Status GetAuditLog(grpc::ServerContext* context, const v1::GetAuditLogRequest* request,
                           v1::AuditLog* response) override;

 private:
  // Counts, logs and converts.
  grpc::Status Finish(const char* method, const absl::Status& status);
  absl::StatusOr<service::ValidatedJob> Validate(const v1::JobSpec& spec) const;

  const service::DaemonSettings& settings_;
  const service::PathPolicy& paths_;
  JobRunner& runner_;
  DaemonMetrics* metrics_;
  StructuredLog& log_;
  const JobAccess& access_;
  const std::string public_key_hex_;
};

// "id: ..." errors for empty, over-long or odd job ids (INVALID_ARGUMENT).
absl::Status ValidateJobId(const std::string& id);

}  // namespace megatrain::server
