// UringRing: move-only owner of one io_uring instance (liburing), torn down on destruction.
#pragma once

#include <liburing.h>

#include <memory>

#include "absl/status/statusor.h"

namespace megatrain::engine::tiers {

class UringRing {
 public:
  // UNAVAILABLE (with the errno text) when the kernel refuses io_uring, e.g. when it is disabled
  // by sysctl kernel.io_uring_disabled or by a seccomp profile.
  static absl::StatusOr<UringRing> Create(unsigned entries);

  UringRing() = default;
  UringRing(UringRing&&) noexcept = default;
  UringRing& operator=(UringRing&&) noexcept = default;
  ~UringRing() = default;

  io_uring* get() const { return ring_.get(); }
  unsigned entries() const { return entries_; }

 private:
  struct Exit {
    void operator()(io_uring* ring) const;
  };
  // Heap-held: liburing's struct must not move while the kernel maps it.
  std::unique_ptr<io_uring, Exit> ring_;
  unsigned entries_ = 0;
};

}  // namespace megatrain::engine::tiers
