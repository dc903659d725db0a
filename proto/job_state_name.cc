// JobStateName (see job_state_name.h).
#include "proto/job_state_name.h"

namespace megatrain::v1 {

std::string JobStateName(JobState state) {
  return state == JOB_STATE_UNSPECIFIED ? "UNSPECIFIED" : JobState_Name(state);
}

}  // namespace megatrain::v1
