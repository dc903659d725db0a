// NCCL result -> absl::Status mapping.
#include "engine/dist/nccl_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace megatrain::engine::dist {

absl::Status NcclStatus(ncclResult_t result, absl::string_view call, int rank,
                        absl::string_view detail) {
  if (result == ncclSuccess) return absl::OkStatus();
  std::string message = absl::StrCat("rank ", rank, ": ", call, ": ", ncclGetErrorString(result));
  if (!detail.empty()) absl::StrAppend(&message, ": ", detail);
  switch (result) {
    case ncclInvalidArgument:
      return absl::InvalidArgumentError(message);
    case ncclInvalidUsage:
      return absl::FailedPreconditionError(message);
    case ncclRemoteError:
    case ncclSystemError:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace megatrain::engine::dist
