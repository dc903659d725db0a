// The small helpers JobRunner's source files share (job_runner*.cc, job_step_observer.cc): the
// clock the runner stamps jobs with, which states have ended, and how a job's restart point is
// worded. Private to the runner; not part of its API.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/megatrain.pb.h"

namespace megatrain::server::job_runner_internal {

inline int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

inline bool IsTerminal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

inline std::string CheckpointNote(const v1::Job& job) {
  return job.progress().last_checkpoint().empty()
             ? std::string("no checkpoint yet, so from step 0")
             : absl::StrCat("from its checkpoint ", job.progress().last_checkpoint());
}

}  // namespace megatrain::server::job_runner_internal
