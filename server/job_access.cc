// JobAccess (see job_access.h).
#include "server/job_access.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace megatrain::server {
namespace {

std::string AdminsText(const AdminPolicy& admins) {
  return admins.admin_group().empty()
             ? std::string("root and the daemon's user")
             : absl::StrCat("root, the daemon's user and the admin group '", admins.admin_group(),
                            "'");
}

}  // namespace

Caller JobAccess::Identify(absl::string_view grpc_peer) const {
  if (std::optional<PeerCredentials> peer = peers_.Lookup(grpc_peer)) {
    return Caller{peer->uid, admins_.IsAdmin(*peer)};
  }
  if (absl::StartsWith(grpc_peer, "ipv4:") || absl::StartsWith(grpc_peer, "ipv6:")) {
    return Caller{std::nullopt, true};  // only callers with the bearer token get this far
  }
  return Caller{std::nullopt, false};
}

absl::Status JobAccess::AuthorizeJob(const Caller& caller, const std::string& job_id,
                                     absl::string_view action) const {
  if (caller.admin) return absl::OkStatus();
  absl::StatusOr<v1::Job> job = runner_.Get(job_id);
  if (!job.ok()) return job.status();
  if (caller.uid.has_value() && job->has_submitter_uid() && job->submitter_uid() == *caller.uid) {
    return absl::OkStatus();
  }
  const std::string message = absl::StrCat(
      action, " of job '", job_id, "' refused for ", caller.Describe(),
      ": the job was submitted by ",
      job->has_submitter_uid() ? absl::StrCat("uid ", job->submitter_uid())
                               : std::string("an unrecorded caller (over TCP, or before "
                                             "submitters were recorded)"),
      "; only its submitter and ", AdminsText(admins_), " may");
  runner_.RecordAccessRefusal(job_id, message);
  return absl::PermissionDeniedError(message);
}

absl::Status JobAccess::AuthorizeAdmin(const Caller& caller, absl::string_view action) const {
  if (caller.admin) return absl::OkStatus();
  const std::string message = absl::StrCat(action, " refused for ", caller.Describe(), ": only ",
                                           AdminsText(admins_), " may");
  log_.Event("access_refused", {{"message", message}});
  return absl::PermissionDeniedError(message);
}

}  // namespace megatrain::server
