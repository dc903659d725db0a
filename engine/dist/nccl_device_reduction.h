// NcclDeviceReduction: DeviceReduction among the CUDA devices of one process over NCCL, one
// communicator per device (ncclCommInitAll's world), each driven by its device's lane thread.
//
// The reduce-scatter is NCCL's (in place, or into a shard buffer) on the executor's copy_out
// stream: sums in NCCL's order (docs/scale_out.md "What is not bitwise"), within fp32 rounding of
// one device's accumulation, repeatable run to run. A failed step aborts the communicators (so no
// device is left in a collective its peer never joins); the next step's Reset makes fresh ones.
#pragma once

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/device/device.h"
#include "engine/dist/nccl_communicator.h"
#include "engine/exec/device_reduction.h"

namespace megatrain::engine::dist {

class NcclDeviceReduction final : public DeviceReduction {
 public:
  // One rank per entry of `devices` (CUDA devices of this process, distinct ordinals), rank i on
  // devices[i]. INVALID_ARGUMENT naming the entry that is not a CUDA device.
  static absl::StatusOr<std::unique_ptr<NcclDeviceReduction>> Create(
      const std::vector<Device*>& devices, const NcclOptions& options = {});
  ~NcclDeviceReduction() override;  // closes the communicators (all ranks are this process's)

  int world() const override { return static_cast<int>(ordinals_.size()); }
  std::string_view order() const override { return "nccl"; }
  absl::Status EnqueueReduceScatter(int rank, Stream& stream, const float* send, float* recv,
                                    size_t shard_elements, const TimelineTag& tag) override;
  void Abort() override;
  void Reset() override;

 private:
  NcclDeviceReduction(std::vector<int> ordinals, const NcclOptions& options,
                      std::vector<NcclCommunicator> ranks);

  const std::vector<int> ordinals_;
  const NcclOptions options_;
  // One lock per rank: a rank's lane thread holds it while NCCL enqueues (bounded by the
  // collective timeout), Abort takes each in turn, so no communicator is aborted under a call.
  std::vector<std::unique_ptr<absl::Mutex>> rank_mu_;
  std::vector<NcclCommunicator> ranks_;
  absl::Status recreate_status_;  // why Reset could not make fresh communicators
};

}  // namespace megatrain::engine::dist
