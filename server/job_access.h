// JobAccess: who may do what to a job (issue 16, point 12). Any caller of the socket may submit,
// read, list and watch; cancel, pause, resume, checkpoint and the audit log of a job need its
// submitter (the recorded uid) or an admin (AdminPolicy), PurgeJobs an admin. Every refusal is
// PERMISSION_DENIED naming the caller, the job's submitter and the admin group, and is appended
// to the job's audit chain (kind "access_refused") and logged.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/job_runner.h"
#include "server/peer_identity.h"
#include "server/structured_log.h"

namespace megatrain::server {

class JobAccess {
 public:
  // Everything passed in outlives this object.
  JobAccess(const PeerRegistry& peers, const AdminPolicy& admins, JobRunner& runner,
            StructuredLog& log)
      : peers_(peers), admins_(admins), runner_(runner), log_(log) {}

  // The caller behind a gRPC peer string: a recorded Unix peer ("fd:<n>"), the TCP token
  // holder ("ipv4:..."/"ipv6:...", authenticated by the token check, an admin), or nobody (an
  // unknown peer: no uid, no rights beyond reading).
  Caller Identify(absl::string_view grpc_peer) const;
  // OK for the job's submitter and admins; NOT_FOUND for an unknown job; else the refusal.
  // `action` names the call in the message ("cancel", "audit", ...).
  absl::Status AuthorizeJob(const Caller& caller, const std::string& job_id,
                            absl::string_view action) const;
  absl::Status AuthorizeAdmin(const Caller& caller, absl::string_view action) const;

 private:
  const PeerRegistry& peers_;
  const AdminPolicy& admins_;
  JobRunner& runner_;
  StructuredLog& log_;
};

}  // namespace megatrain::server
