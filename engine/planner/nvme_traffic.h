// NVMe bytes one optimizer step moves, per buffer kind, for a placement: exact, from the
// placement's byte counts and the engine's protocol (docs/planning.md "NVMe traffic").
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/tiers/placement.h"

namespace megatrain::engine::planner {

// What the engine moves per optimizer step of `micro_batches` micro-batches:
//  - m, v and the master (when on NVMe): read once and written once by the optimizer pass;
//  - the fp32 gradients on NVMe (the entries Placement::grad_on_nvme names: not the embedding's,
//    nor those the RAM left over keeps): written by backward's copy-out every micro-batch (the
//    first overwrites; each later one reads the sum back and writes it again), then read once
//    by the optimizer pass.
//  - the compute copy on NVMe (all entries but the embedding's): written once by the optimizer
//    pass, read by the weight copies `copy_reads_per_micro_batch` times per micro-batch
//    (forward, backward, and the recompute of the layers below the top block: 3 with
//    recomputation, 2 with every activation kept).
struct NvmeTraffic {
  std::array<uint64_t, tiers::kNumBufferKinds> read{};     // bytes per step, by BufferKind
  std::array<uint64_t, tiers::kNumBufferKinds> written{};  // bytes per step, by BufferKind
  uint64_t read_bytes = 0;                                 // sums over kinds
  uint64_t written_bytes = 0;
  // Of which in backward (gradient copy-out) and in the optimizer pass.
  uint64_t backward_read_bytes = 0;
  uint64_t backward_written_bytes = 0;
  uint64_t optimizer_read_bytes = 0;
  uint64_t optimizer_written_bytes = 0;
  uint64_t weights_read_bytes = 0;  // the compute copy, read by forward/recompute/backward
};

// `gradients_summed_on_device` (GradientAccumulation::kDevice): the gradients on NVMe are
// written once a step, by the last micro-batch, and never read back in backward (every gradient
// the placement can put on NVMe is summed on the device: the embedding's stays in RAM).
NvmeTraffic NvmeTrafficPerStep(const tiers::Placement& placement, int micro_batches,
                               int copy_reads_per_micro_batch = 3,
                               bool gradients_summed_on_device = false);

// The compute copy's reads as counted op by op (the step-time replay knows which weight copies
// the executor's schedule and slot policy make; resident slots read nothing).
void SetWeightReads(NvmeTraffic& traffic, uint64_t bytes);

// Per parameter-store entry, the NVMe bytes of the same protocol, for the step-time replay:
// the optimizer pass's reads and writes of entry e (the compute copy's write included), the
// bytes of e's gradient that live on NVMe (0 when the gradient stays in RAM), and of its compute
// copy (read by each weight copy of e). Sums equal NvmeTrafficPerStep's.
struct NvmeEntryIo {
  std::vector<double> optimizer_read;
  std::vector<double> optimizer_written;
  std::vector<double> gradient_bytes;
  std::vector<double> compute_copy_bytes;
};

NvmeEntryIo NvmeIoPerEntry(const std::vector<tiers::EntryBytes>& entries,
                           const tiers::Placement& placement);

// "12.35 GB read, 12.35 GB written (m 6.17/6.17, ...)".
std::string DescribeNvmeTraffic(const NvmeTraffic& traffic);

}  // namespace megatrain::engine::planner
