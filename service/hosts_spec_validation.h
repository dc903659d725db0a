// ValidateHosts: JobSpec.hosts and JobSpec.zero1 checked at the edge (host names that cannot be
// taken for launcher options, rank counts, the features a job over several machines supports).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/megatrain.pb.h"
#include "service/validated_job.h"

namespace megatrain::service {

// Most machines and ranks a job may name: a bound on what one daemon launches and supervises.
inline constexpr int kMaxJobHosts = 256;
inline constexpr int kMaxRanksPerHost = 64;

// Parses spec.hosts into job.hosts and job.ranks; refuses (naming the field and value) a name
// that is empty, starts with '-', or has characters outside [A-Za-z0-9._-], a rank count outside
// 1..kMaxRanksPerHost, more than kMaxJobHosts entries, zero1 without hosts, and data.eval_prompts
// or speculative_update with hosts (the replies need the chat tool's process beside rank 0; the
// ranks combine gradients only after the last micro-batch). A name other than
// "localhost" must be one of `allowed` (the daemon's allowed_hosts: PERMISSION_DENIED otherwise)
// unless `any_host` (a plan for another machine, which launches nothing).
absl::Status ValidateHosts(const v1::JobSpec& spec, const std::vector<std::string>& allowed,
                           bool any_host, ValidatedJob& job);

// mpirun's --host value for `hosts`: "a:2,b:1".
std::string MpirunHostList(const std::vector<RankHost>& hosts);

}  // namespace megatrain::service
