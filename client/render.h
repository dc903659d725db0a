// Rendering for the CLI: jobs and statuses as text or JSON, and the watch progress bar.
#pragma once

#include <string>

#include "google/protobuf/message.h"
#include "proto/megatrain.pb.h"

namespace megatrain::client {

// Proto3 JSON with the .proto field names, one object.
std::string ToJson(const google::protobuf::Message& message);
// "job-000001  RUNNING  step 12/40  loss 3.1234  name"
std::string JobLine(const v1::Job& job);
// Several lines: state, progress, memory, failure reason.
std::string JobDetails(const v1::Job& job);
std::string DaemonStatusText(const v1::DaemonStatus& status);
std::string PlanText(const v1::PlanResponse& plan);
// One line per audit row (the first bad one marked BAD), then the chain's verdict.
std::string AuditText(const v1::AuditLog& log);
// One progress line; with `bar`, a 30-character bar first (for terminals).
std::string ProgressLine(const v1::ProgressEvent& event, bool bar);

}  // namespace megatrain::client
