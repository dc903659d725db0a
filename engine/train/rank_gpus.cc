// ChooseRankGpus (see rank_gpus.h).
#include "engine/train/rank_gpus.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "engine/device/cuda_device.h"
#include "engine/train/data_parallel_step.h"

namespace megatrain::engine {

absl::Status ChooseRankGpus(dist::MpiCommunicator& mpi, bool choose, int devices, int& first) {
  if (choose) {
    // Ranks sharing a machine must not share its GPUs (NCCL refuses two ranks on one).
    absl::StatusOr<int> visible = CountCudaDevices();
    if (!visible.ok()) return visible.status();
    absl::StatusOr<int> chosen =
        RankFirstDevice({.local_rank = mpi.local_rank(),
                         .local_size = mpi.local_size(),
                         .devices_per_rank = devices,
                         .visible = *visible,
                         .launcher_restricted = std::getenv("CUDA_VISIBLE_DEVICES") != nullptr});
    if (!chosen.ok()) return chosen.status();
    first = *chosen;
  }
  std::vector<std::string> gpus;
  for (int d = 0; d < devices; ++d) {
    absl::StatusOr<std::string> uuid = CudaDeviceUuid(first + d);
    if (!uuid.ok()) return uuid.status();
    gpus.push_back(*uuid);
  }
  return CheckDistinctGpus(mpi, gpus);
}

}  // namespace megatrain::engine
