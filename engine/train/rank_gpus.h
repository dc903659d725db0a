// ChooseRankGpus: which GPUs a data-parallel rank launched by mpirun or srun drives, and the
// check that no GPU serves two ranks (docs/scale_out.md "Which GPUs a rank drives"); shared by
// train_local and the daemon's ranks (megatrain_rank).
#pragma once

#include "absl/status/status.h"
#include "engine/dist/mpi_communicator.h"

namespace megatrain::engine {

// With `choose`, this rank's share of its machine's GPUs (RankFirstDevice) into `first`; then,
// whatever chose them, the job's ranks compare the UUIDs of GPUs first..first+devices-1 (a
// collective), so no GPU serves two ranks whatever CUDA_VISIBLE_DEVICES says.
absl::Status ChooseRankGpus(dist::MpiCommunicator& mpi, bool choose, int devices, int& first);

}  // namespace megatrain::engine
