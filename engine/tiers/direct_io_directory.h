// CheckDirectIoDirectory: refuses an NVMe-tier directory that is memory-backed (tmpfs, ramfs) or
// whose filesystem cannot do O_DIRECT, so the tier is never silently served from RAM.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace megatrain::engine::tiers {

// OK when `dir` is an existing directory on a block-backed filesystem where an O_DIRECT file can
// be created, written and read back (a 4 KiB probe file, removed again). FAILED_PRECONDITION
// naming the directory and the filesystem otherwise.
absl::Status CheckDirectIoDirectory(const std::string& dir);

}  // namespace megatrain::engine::tiers
