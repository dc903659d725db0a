// Maps an NCCL result onto absl::Status, naming the call, the rank and NCCL's own words for it.
#pragma once

#include <nccl.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace megatrain::engine::dist {

// OK for ncclSuccess. Otherwise the message reads "rank R: CALL: <ncclGetErrorString>: <detail>"
// (detail: ncclGetLastError's text, left out when empty) and the code follows the cause:
// ncclInvalidArgument -> INVALID_ARGUMENT; ncclInvalidUsage (calls out of order, a mismatched
// group) -> FAILED_PRECONDITION; ncclRemoteError, ncclSystemError (a peer or the network went
// away) -> UNAVAILABLE; ncclInProgress passed here (a caller that did not wait) and the rest
// (ncclUnhandledCudaError, ncclInternalError) -> INTERNAL.
absl::Status NcclStatus(ncclResult_t result, absl::string_view call, int rank,
                        absl::string_view detail);

}  // namespace megatrain::engine::dist
