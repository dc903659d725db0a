// NVMe bytes per optimizer step of a placement (see nvme_traffic.h).
#include "engine/planner/nvme_traffic.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace megatrain::engine::planner {

using tiers::BufferKind;
using tiers::Tier;

NvmeTraffic NvmeTrafficPerStep(const tiers::Placement& p, int micro_batches,
                               int copy_reads_per_micro_batch, bool gradients_summed_on_device) {
  const uint64_t a = static_cast<uint64_t>(std::max(1, micro_batches));
  const uint64_t gradient_writes = gradients_summed_on_device ? 1 : a;
  NvmeTraffic t;
  for (int k = 0; k < tiers::kNumBufferKinds; ++k) {
    const tiers::KindPlacement& kp = p.kinds[k];
    if (kp.tier != Tier::kNvme) continue;
    const uint64_t on_nvme = kp.bytes - kp.ram_resident;
    if (static_cast<BufferKind>(k) == BufferKind::kGrad) {
      // Backward: written every micro-batch, read back from the second on (summed on the
      // device: written once); optimizer: read once.
      t.backward_written_bytes += on_nvme * gradient_writes;
      t.backward_read_bytes += on_nvme * (gradient_writes - 1);
      t.optimizer_read_bytes += on_nvme;
      t.written[k] = on_nvme * gradient_writes;
      t.read[k] = on_nvme * gradient_writes;
    } else if (static_cast<BufferKind>(k) == BufferKind::kComputeCopy) {
      // Written by the optimizer pass; read by every weight copy of every micro-batch.
      const uint64_t reads = on_nvme * a * static_cast<uint64_t>(copy_reads_per_micro_batch);
      t.optimizer_written_bytes += on_nvme;
      t.weights_read_bytes += reads;
      t.written[k] = on_nvme;
      t.read[k] = reads;
    } else {
      t.optimizer_read_bytes += on_nvme;
      t.optimizer_written_bytes += on_nvme;
      t.written[k] = on_nvme;
      t.read[k] = on_nvme;
    }
  }
  t.read_bytes = t.backward_read_bytes + t.optimizer_read_bytes + t.weights_read_bytes;
  t.written_bytes = t.backward_written_bytes + t.optimizer_written_bytes;
  return t;
}

void SetWeightReads(NvmeTraffic& t, uint64_t bytes) {
  const int copy = static_cast<int>(BufferKind::kComputeCopy);
  t.read_bytes = t.read_bytes - t.weights_read_bytes + bytes;
  t.weights_read_bytes = bytes;
  t.read[copy] = bytes;
}

NvmeEntryIo NvmeIoPerEntry(const std::vector<tiers::EntryBytes>& entries,
                           const tiers::Placement& p) {
  NvmeEntryIo io;
  io.optimizer_read.assign(entries.size(), 0);
  io.optimizer_written.assign(entries.size(), 0);
  io.gradient_bytes.assign(entries.size(), 0);
  io.compute_copy_bytes.assign(entries.size(), 0);
  for (size_t e = 0; e < entries.size(); ++e) {
    for (BufferKind k : {BufferKind::kMaster, BufferKind::kM, BufferKind::kV}) {
      if (p.tier(k) != Tier::kNvme) continue;
      io.optimizer_read[e] += static_cast<double>(entries[e][k]);
      io.optimizer_written[e] += static_cast<double>(entries[e][k]);
    }
    if (p.grad_on_nvme(static_cast<int>(e))) {
      io.gradient_bytes[e] = static_cast<double>(entries[e][BufferKind::kGrad]);
      io.optimizer_read[e] += io.gradient_bytes[e];
    }
    if (p.tier(BufferKind::kComputeCopy) == Tier::kNvme && !entries[e].compute_copy_stays_in_ram) {
      // On the CPU device the placement adds an fp32 copy of the master's bytes.
      const uint64_t copy = entries[e][BufferKind::kComputeCopy];
      io.compute_copy_bytes[e] =
          static_cast<double>(copy > 0 ? copy : entries[e][BufferKind::kMaster]);
      io.optimizer_written[e] += io.compute_copy_bytes[e];
    }
  }
  return io;
}

std::string DescribeNvmeTraffic(const NvmeTraffic& t) {
  std::vector<std::string> parts;
  for (int k = 0; k < tiers::kNumBufferKinds; ++k) {
    if (t.read[k] == 0 && t.written[k] == 0) continue;
    parts.push_back(absl::StrFormat("%s %.2f/%.2f",
                                    tiers::BufferKindName(static_cast<BufferKind>(k)),
                                    t.read[k] / 1e9, t.written[k] / 1e9));
  }
  return absl::StrFormat("%.2f GB read, %.2f GB written (GB read/written: %s)", t.read_bytes / 1e9,
                         t.written_bytes / 1e9, absl::StrJoin(parts, ", "));
}

}  // namespace megatrain::engine::planner
