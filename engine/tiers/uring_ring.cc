// UringRing: io_uring setup and teardown.
#include "engine/tiers/uring_ring.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace megatrain::engine::tiers {

void UringRing::Exit::operator()(io_uring* ring) const {
  io_uring_queue_exit(ring);
  delete ring;
}

absl::StatusOr<UringRing> UringRing::Create(unsigned entries) {
  auto raw = std::make_unique<io_uring>();
  const int rc = io_uring_queue_init(entries, raw.get(), 0);
  if (rc < 0) {
    return absl::UnavailableError(absl::StrCat("io_uring setup with ", entries, " entries failed: ",
                                               std::strerror(-rc), " (errno ", -rc, ")"));
  }
  UringRing ring;
  ring.ring_.reset(raw.release());
  ring.entries_ = entries;
  return ring;
}

}  // namespace megatrain::engine::tiers
