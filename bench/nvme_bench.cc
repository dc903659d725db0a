// nvme_bench: optimizer-state streaming through NvmeStateStore against the same directory's own
// O_DIRECT sequential bandwidth, measured in the same run (io_uring, swept over queue depth and
// request size; the best read and write figures are the bound).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "engine/tiers/aligned_buffer.h"
#include "engine/tiers/direct_io_directory.h"
#include "engine/tiers/nvme_state_store.h"
#include "engine/tiers/uring_block_io.h"

ABSL_FLAG(std::string, dir, "/var/tmp/megatrain_nvme_bench", "block-backed scratch directory");
ABSL_FLAG(int64_t, probe_mib, 1024, "size of the sequential probe file in MiB");
ABSL_FLAG(std::vector<std::string>, queue_depths, std::vector<std::string>({"4", "16", "64"}),
          "probe queue depths");
ABSL_FLAG(std::vector<std::string>, request_kib, std::vector<std::string>({"256", "1024", "4096"}),
          "probe request sizes in KiB");
ABSL_FLAG(int, entries, 32, "optimizer entries streamed (m and v each)");
ABSL_FLAG(int64_t, entry_mib, 16, "MiB of each of m and v per entry");
ABSL_FLAG(int, passes, 3, "optimizer passes (the first is warm-up)");
ABSL_FLAG(int, read_ahead, 2, "store read-ahead entries");
ABSL_FLAG(int, writes_in_flight, 2, "store write-backs in flight");
ABSL_FLAG(int, store_queue_depth, megatrain::engine::tiers::kDefaultQueueDepth,
          "io_uring queue depth of the store");
ABSL_FLAG(int64_t, store_request_kib, megatrain::engine::tiers::kDefaultBlockBytes >> 10,
          "store request size in KiB");

namespace megatrain::engine::tiers {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Sequential O_DIRECT transfer of the whole file; returns GB/s.
double Sequential(BlockIo& io, DirectFile& file, IoOp op, uint64_t bytes, size_t request,
                  std::vector<AlignedBuffer>& buffers) {
  std::vector<IoFuture> inflight(buffers.size());
  const auto t0 = Clock::now();
  size_t i = 0;
  for (uint64_t off = 0; off < bytes; off += request, ++i) {
    IoFuture& slot = inflight[i % inflight.size()];
    if (slot.valid() && !slot.Wait().ok()) std::abort();
    slot = io.Submit({op, &file, off, buffers[i % buffers.size()].data(), request});
  }
  for (IoFuture& f : inflight) {
    if (f.valid()) {
      absl::Status s = f.Wait();
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.ToString().c_str());
        std::exit(1);
      }
    }
  }
  return static_cast<double>(bytes) / Since(t0) / 1e9;
}

// Reads `bytes` of `from` while writing `bytes` of `to`, requests alternating, `buffers.size()`
// in flight: what the disk moves when the optimizer's read-ahead and write-back overlap, as
// they do in a step. Returns GB/s of both directions together.
double Mixed(BlockIo& io, DirectFile& from, DirectFile& to, uint64_t bytes, size_t request,
             std::vector<AlignedBuffer>& buffers) {
  std::vector<IoFuture> inflight(buffers.size());
  const auto t0 = Clock::now();
  size_t i = 0;
  for (uint64_t off = 0; off < bytes; off += request) {
    for (IoOp op : {IoOp::kRead, IoOp::kWrite}) {
      IoFuture& slot = inflight[i % inflight.size()];
      if (slot.valid() && !slot.Wait().ok()) std::abort();
      slot = io.Submit({op, op == IoOp::kRead ? &from : &to, off,
                        buffers[i % buffers.size()].data(), request});
      ++i;
    }
  }
  for (IoFuture& f : inflight) {
    if (f.valid() && !f.Wait().ok()) std::abort();
  }
  return 2.0 * static_cast<double>(bytes) / Since(t0) / 1e9;
}

int Run() {
  const std::string dir = absl::GetFlag(FLAGS_dir);
  std::filesystem::create_directories(dir);
  if (absl::Status s = CheckDirectIoDirectory(dir); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  const uint64_t probe_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_probe_mib)) << 20;
  double best_read = 0, best_write = 0;
  std::printf("probe: %s, %llu MiB, O_DIRECT io_uring sequential\n", dir.c_str(),
              static_cast<unsigned long long>(probe_bytes >> 20));
  std::printf("%6s %9s %10s %10s %11s\n", "qdepth", "req_KiB", "write_GB/s", "read_GB/s",
              "mixed_GB/s");
  for (const std::string& qd_text : absl::GetFlag(FLAGS_queue_depths)) {
    for (const std::string& kib_text : absl::GetFlag(FLAGS_request_kib)) {
      const int qd = std::stoi(qd_text);
      const size_t request = std::stoull(kib_text) << 10;
      auto io = UringBlockIo::Create({.queue_depth = qd});
      if (!io.ok()) {
        std::fprintf(stderr, "%s\n", io.status().ToString().c_str());
        return 1;
      }
      auto file = DirectFile::Open(dir + "/probe.bin", DirectFile::Mode::kCreateTruncate);
      if (!file.ok() || !file->Reserve(probe_bytes).ok()) return 1;
      std::vector<AlignedBuffer> buffers;
      for (int b = 0; b < qd; ++b) buffers.push_back(*AlignedBuffer::Allocate(request));
      const double w = Sequential(**io, *file, IoOp::kWrite, probe_bytes, request, buffers);
      if (!file->Sync().ok()) return 1;
      const double r = Sequential(**io, *file, IoOp::kRead, probe_bytes, request, buffers);
      // Half the probe read back while a second file of that size is written.
      auto second = DirectFile::Open(dir + "/probe2.bin", DirectFile::Mode::kCreateTruncate);
      if (!second.ok() || !second->Reserve(probe_bytes / 2).ok()) return 1;
      const double mixed = Mixed(**io, *file, *second, probe_bytes / 2, request, buffers);
      if (!second->Sync().ok()) return 1;
      best_read = std::max(best_read, r);
      best_write = std::max(best_write, w);
      std::printf("%6d %9zu %10.2f %10.2f %11.2f\n", qd, request >> 10, w, r, mixed);
    }
  }
  std::filesystem::remove(dir + "/probe.bin");
  std::filesystem::remove(dir + "/probe2.bin");

  // Optimizer-state streaming: each pass acquires every entry in order (m and v read ahead),
  // touches one float per page (a stand-in for an update far faster than the disk), releases.
  auto io = UringBlockIo::Create({.queue_depth = absl::GetFlag(FLAGS_store_queue_depth)});
  if (!io.ok()) return 1;
  NvmeStateStoreOptions o;
  o.request_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_store_request_kib)) << 10;
  o.dir = dir;
  o.read_ahead = absl::GetFlag(FLAGS_read_ahead);
  o.max_writes_in_flight = absl::GetFlag(FLAGS_writes_in_flight);
  const size_t elements = static_cast<size_t>(absl::GetFlag(FLAGS_entry_mib)) << 18;
  auto store =
      NvmeStateStore::Create(**io, o, std::vector<size_t>(absl::GetFlag(FLAGS_entries), elements));
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    return 1;
  }
  double seconds = 0;
  uint64_t moved = 0;
  const int passes = absl::GetFlag(FLAGS_passes);
  for (int pass = 0; pass < passes; ++pass) {
    const auto t0 = Clock::now();
    const uint64_t before = (*store)->stats().bytes_read + (*store)->stats().bytes_written;
    for (int e = 0; e < (*store)->num_entries(); ++e) {
      auto s = (*store)->Acquire(e);
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.status().ToString().c_str());
        return 1;
      }
      for (size_t i = 0; i < elements; i += 1024) s->array(0)[i] += 1.0f, s->array(1)[i] += 1.0f;
      if (!(*store)->Release(e).ok()) return 1;
    }
    if (!(*store)->Flush().ok()) return 1;
    if (pass > 0) {
      seconds += Since(t0);
      moved += (*store)->stats().bytes_read + (*store)->stats().bytes_written - before;
    }
  }
  const double state_gb = static_cast<double>((*store)->file_bytes()) / 1e9;
  // The disk-bound time of a pass: read all of m, v and write them back at the probe's best.
  const double bound_s = state_gb / best_read + state_gb / best_write;
  const double pass_s = seconds / (passes - 1);
  std::printf(
      "\nstate store: %d entries x 2 x %lld MiB = %.2f GB, staging %.0f MiB (%d slots), "
      "queue depth %d, request %zu KiB\n",
      (*store)->num_entries(), static_cast<long long>(absl::GetFlag(FLAGS_entry_mib)), state_gb,
      static_cast<double>((*store)->staging_bytes()) / (1 << 20), (*store)->staging_slots(),
      (*io)->queue_depth(), o.request_bytes >> 10);
  std::printf("pass (read m,v + write back): %.3f s, %.2f GB/s moved\n", pass_s,
              static_cast<double>(moved) / seconds / 1e9);
  std::printf("disk bound (best probe read %.2f GB/s, write %.2f GB/s): %.3f s per pass\n",
              best_read, best_write, bound_s);
  std::printf("ratio (bound / pass time): %.2f  [target >= 0.80]\n", bound_s / pass_s);
  std::printf("acquire stall %.3f s, release stall %.3f s over %d timed passes\n",
              (*store)->stats().acquire_wait_seconds, (*store)->stats().release_wait_seconds,
              passes - 1);
  const std::string path = (*store)->path();
  store->reset();
  std::filesystem::remove(path);
  return 0;
}

}  // namespace
}  // namespace megatrain::engine::tiers

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return megatrain::engine::tiers::Run();
}
