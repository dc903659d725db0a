// ValidateHosts and MpirunHostList (see hosts_spec_validation.h).
#include "service/hosts_spec_validation.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "service/spec_field_checks.h"

namespace megatrain::service {
namespace {

bool IsHostNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '-' || c == '_';
}

}  // namespace

absl::Status ValidateHosts(const v1::JobSpec& spec, const std::vector<std::string>& allowed,
                           bool any_host, ValidatedJob& job) {
  job.hosts.clear();
  job.ranks = 1;
  if (spec.hosts_size() == 0) {
    if (spec.zero1()) {
      return Invalid("zero1",
                     "true without hosts (ZeRO-1 shards the optimizer state among the "
                     "ranks of a job on several machines)");
    }
    return absl::OkStatus();
  }
  if (spec.hosts_size() > kMaxJobHosts) {
    return Invalid("hosts",
                   absl::StrCat(spec.hosts_size(), " entries are more than ", kMaxJobHosts));
  }
  int ranks = 0;
  for (const std::string& entry : spec.hosts()) {
    const std::string shown = absl::StrCat("'", entry.substr(0, 80), "'");
    const size_t colon = entry.find(':');
    RankHost host;
    host.name = entry.substr(0, colon);
    // A leading '-' would reach mpirun as an option; anything else outside a host name's
    // characters could reach a shell on the far side (ssh).
    if (host.name.empty() || host.name[0] == '-' || host.name.size() > 253) {
      return Invalid("hosts", absl::StrCat(shown, " is not a host name"));
    }
    for (char c : host.name) {
      if (!IsHostNameChar(c)) {
        return Invalid("hosts", absl::StrCat(shown,
                                             " is not a host name (letters, digits, '.', "
                                             "'-' and '_' only)"));
      }
    }
    // The daemon's user runs the ranks there: only where its administrator allows.
    if (!any_host && host.name != "localhost" &&
        std::find(allowed.begin(), allowed.end(), host.name) == allowed.end()) {
      return absl::PermissionDeniedError(
          absl::StrCat("hosts: ", shown, " is not one of the daemon's allowed_hosts (",
                       allowed.empty() ? "none: ranks on this machine only, \"localhost\""
                                       : absl::StrJoin(allowed, ", "),
                       ")"));
    }
    if (colon != std::string::npos) {
      if (!absl::SimpleAtoi(entry.substr(colon + 1), &host.ranks) || host.ranks < 1 ||
          host.ranks > kMaxRanksPerHost) {
        return Invalid(
            "hosts", absl::StrCat(shown, ": the ranks after ':' must be 1 to ", kMaxRanksPerHost));
      }
    }
    ranks += host.ranks;
    job.hosts.push_back(std::move(host));
  }
  if (spec.data().eval_prompts_size() > 0) {
    return Invalid("data.eval_prompts",
                   "not with hosts: the replies are rendered by the chat tool beside the daemon, "
                   "not beside rank 0");
  }
  // The Trainer would leave it off without a word (TrainerOptions::speculative_update): the
  // ranks' gradients are combined only after every rank's last micro-batch.
  if (spec.speculative_update()) {
    return Invalid("speculative_update",
                   "true with hosts: the ranks combine their gradients only after the last "
                   "micro-batch, so no update can start during its backward");
  }
  job.ranks = ranks;
  return absl::OkStatus();
}

std::string MpirunHostList(const std::vector<RankHost>& hosts) {
  std::string list;
  for (const RankHost& h : hosts)
    absl::StrAppend(&list, list.empty() ? "" : ",", h.name, ":", h.ranks);
  return list;
}

}  // namespace megatrain::service
