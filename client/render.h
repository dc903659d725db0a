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
// One device of the daemon: "device 0:      cpu  arena 3.0 MiB of 1.00 GiB  healthy" (no newline),
// as daemon-status and top list them.
std::string DeviceStatusLine(const v1::DeviceStatus& device);
std::string PlanText(const v1::PlanResponse& plan);
// One line per audit row (the first bad one marked BAD), then the chain's verdict.
std::string AuditText(const v1::AuditLog& log);
// One progress line; with `bar`, a 30-character bar first (for terminals). "val" appears once
// the job has been evaluated (validation_loss is NaN before).
std::string ProgressLine(const v1::ProgressEvent& event, bool bar);
// `line` on one terminal row of `columns` characters: line breaks and tabs become spaces and it
// is cut (never inside a UTF-8 character) so a redraw with "\r" leaves no trail; columns <= 0
// keeps the whole line.
std::string FitToWidth(const std::string& line, int columns);
// "45s", "3m05s", "2h10m"; "?" for a negative or non-finite number of seconds.
std::string DurationText(double seconds);

}  // namespace megatrain::client
