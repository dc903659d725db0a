// One side of the data-parallel exactness test (dp_exactness_test.sh). Launched by mpirun, rank r
// of W trains a tiny model on micro-batch slot r of every step; run alone, one process trains with
// accumulation W over the same micro-batches. Either way it writes OUT.losses (per step: the
// loss, the gradient norm and the valid count, doubles as hex bits) and OUT.weights (every
// master float, in layout order), OUT being PREFIX.rank<r> or PREFIX.accum, so the test compares
// files byte for byte. With KILL_RANK/KILL_STEP, that rank SIGKILLs itself before that step, or
// with KILL_STEP -1 writes its pid to PREFIX.pid after its first step, for a kill -9 from
// outside (the failure tests). MODE: 0 = untied model, 1 = tied, zero1 / tiedzero1 = untied /
// tied with ZeRO-1 (TrainerOptions::zero1; alone, plain accumulation W), big / bigzero1 = a
// ~30M-parameter untied model for the memory measurement (OUT.vmhwm: the process's peak resident
// kB, VmHWM; a ZeRO-1 rank's OUT.shard: its ranges of the entries). Checkpoints (environment):
// DP_SAVE_DIR and DP_SAVE_AT=N write a checkpoint after step N (ZeRO-1 ranks: a sharded one);
// DP_RESUME_FROM=DIR loads it first and trains the remaining steps. A ZeRO-1 rank of W > 1 also
// tries to write a checkpoint at the end and records the refusal in OUT.ckpt.
//
//   dp_exactness_worker PREFIX W STEPS MODE [KILL_RANK KILL_STEP]
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/checkpoint/checkpoint_reader.h"
#include "engine/checkpoint/checkpoint_writer.h"
#include "engine/dist/mpi_communicator.h"
#include "engine/train/data_parallel_step.h"
#include "tests/engine/tiny_model.h"

namespace megatrain::engine {
namespace {

uint64_t Bits(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

// The process's peak resident set in kB (VmHWM of /proc/self/status), or -1.
long PeakResidentKb() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  long kb = -1;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::strncmp(line, "VmHWM:", 6) == 0) kb = std::atol(line + 6);
  }
  std::fclose(f);
  return kb;
}

absl::Status Run(const std::string& prefix, int world, int steps, const std::string& mode,
                 int kill_rank, int kill_step) {
  const bool tied = mode == "1" || mode == "tiedzero1";
  const bool zero1 = mode == "zero1" || mode == "bigzero1" || mode == "tiedzero1";
  const bool big = mode == "big" || mode == "bigzero1";
  if (!tied && !zero1 && !big && mode != "0") {
    return absl::InvalidArgumentError(
        absl::StrCat("MODE=", mode, " is not 0, 1, zero1, tiedzero1, big or bigzero1"));
  }
  std::unique_ptr<dist::MpiCommunicator> mpi;
  if (dist::LaunchedByMpi()) {
    absl::StatusOr<std::unique_ptr<dist::MpiCommunicator>> c = dist::MpiCommunicator::Create();
    if (!c.ok()) return c.status();
    mpi = std::move(*c);
    if (mpi->size() != world) {
      return absl::InvalidArgumentError(
          absl::StrCat("launched with ", mpi->size(), " ranks, expected W=", world));
    }
  }
  testing::TinyShape shape;
  shape.tied = tied;
  // The embedding and the LM head are 2731 x 48 = 131088 elements each, two 64 Ki-element chunks
  // and 16 elements (the chunk is set below), so ZeRO-1 splits them among ranks (Zero1Shards),
  // not only whole entries.
  shape.vocab = 2731;
  if (big) {
    shape.layers = 8;
    shape.hidden = 512;
    shape.ffn = 1408;
    shape.heads = 8;
    shape.kv_heads = 8;
    shape.vocab = 4096;
  }
  constexpr int kSeq = 16;
  TrainerOptions o;
  o.micro_batch_size = 1;
  o.seq_len = kSeq;
  o.lr.total_steps = steps;
  o.lr.warmup_steps = 1;
  o.executor.weight_slots = 2;
  o.optimizer_threads = 1;
  o.blas_threads = 1;
  o.communicator = mpi.get();
  o.zero1 = zero1 && mpi != nullptr;
  o.memory.nvme_chunk_bytes = size_t{256} << 10;  // the smallest chunk: 64 Ki elements
  auto device = testing::MakeCpuDevice(big ? size_t{1} << 30 : size_t{96} << 20);
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      Trainer::Create(*device, testing::TinyConfig(shape), o);
  if (!trainer.ok()) return trainer.status();
  (*trainer)->InitializeRandom(11);
  const testing::TokenBatches batches =
      testing::MakeTokenBatches(steps * world, kSeq, shape.vocab, 3);

  const std::string out =
      mpi != nullptr ? absl::StrCat(prefix, ".rank", mpi->rank()) : absl::StrCat(prefix, ".accum");
  const char* save_dir = std::getenv("DP_SAVE_DIR");
  const char* save_at = std::getenv("DP_SAVE_AT");
  const char* resume_from = std::getenv("DP_RESUME_FROM");
  int first_step = 0;
  if (resume_from != nullptr) {
    absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(resume_from, **trainer);
    if (!loaded.ok()) return loaded.status();
    first_step = static_cast<int>(loaded->state.progress.step);
  }
  std::string losses;
  for (int step = first_step; step < steps; ++step) {
    if (mpi != nullptr && mpi->rank() == kill_rank && kill_step < 0 && step == 1) {
      // For a kill from outside: say where this rank is, once it is training.
      const std::string pid_file = absl::StrCat(prefix, ".pid");
      FILE* f = std::fopen((pid_file + ".tmp").c_str(), "w");
      if (f == nullptr) return absl::InternalError(absl::StrCat("cannot write ", pid_file));
      std::fprintf(f, "%d\n", static_cast<int>(getpid()));
      std::fclose(f);
      std::rename((pid_file + ".tmp").c_str(), pid_file.c_str());  // appears whole
    }
    if (mpi != nullptr && mpi->rank() == kill_rank && step == kill_step) {
      std::fprintf(stderr, "rank %d: SIGKILL before step %d\n", kill_rank, step);
      std::fflush(stderr);
      std::raise(SIGKILL);
    }
    // Rank r runs micro-batch slot r of this step; alone, all W slots in order.
    const int first = step * world + (mpi != nullptr ? mpi->rank() : 0);
    const int count = mpi != nullptr ? 1 : world;
    absl::StatusOr<StepReport> r =
        (*trainer)->Step(batches.InputPointers(first, count), batches.TargetPointers(first, count));
    if (!r.ok()) return r.status();
    losses += absl::StrFormat("step %d loss %016x norm %016x valid %d\n", r->step, Bits(r->loss),
                              Bits(r->grad_norm), r->valid_tokens);
    if (save_dir != nullptr && save_at != nullptr && step + 1 == std::atoi(save_at)) {
      absl::StatusOr<std::string> written =
          o.zero1 ? WriteShardedCheckpoint(
                        **trainer, save_dir, {}, {},
                        {mpi->rank(), mpi->size(),
                         [&mpi](const absl::Status& mine) { return AllRanksOk(*mpi, mine); }})
                  : WriteCheckpoint(**trainer, save_dir, {});
      if (!written.ok()) return written.status();
    }
    if (mpi != nullptr && mpi->rank() == 0) {
      std::printf("step %d loss %.9g comm %.6f s %llu bytes\n", step + 1, r->loss,
                  r->communication_seconds,
                  static_cast<unsigned long long>(r->communication_bytes));
    }
  }
  if (absl::Status s = (*trainer)->UpdateStatus(); !s.ok()) return s;
  std::string weights;
  if (!big) {
    for (const LayoutEntry& entry : (*trainer)->layout().entries()) {
      for (const TensorSlot& slot : entry.tensors) {
        absl::StatusOr<std::vector<float>> w = (*trainer)->ReadTensor(slot.hf_name);
        if (!w.ok()) return w.status();
        weights.append(reinterpret_cast<const char*>(w->data()), w->size() * sizeof(float));
      }
    }
  }
  const std::string vmhwm = absl::StrCat(PeakResidentKb(), "\n");
  // A ZeRO-1 rank's ranges: "ENTRY FIRST COUNT ELEMENTS" per entry (count 0: none of it).
  std::string shard;
  for (int e = 0; o.zero1 && e < (*trainer)->store().num_entries(); ++e) {
    const ElementRange r = (*trainer)->store().optimizer_state_range(e);
    absl::StrAppend(&shard, e, " ", r.first, " ", r.count, " ",
                    (*trainer)->store().spec(e).elements, "\n");
  }
  std::string ckpt;
  if (o.zero1 && world > 1) {
    const absl::StatusOr<std::string> refused =
        WriteCheckpoint(**trainer, absl::StrCat(out, ".refused_checkpoint"), {});
    ckpt = refused.ok() ? std::string("written\n")
                        : absl::StrCat(absl::StatusCodeToString(refused.status().code()), ": ",
                                       refused.status().message(), "\n");
  }
  for (const auto& [suffix, text] : {std::pair<const char*, const std::string*>{".losses", &losses},
                                     {".weights", &weights},
                                     {".vmhwm", &vmhwm},
                                     {".ckpt", &ckpt},
                                     {".shard", &shard}}) {
    FILE* f = std::fopen((out + suffix).c_str(), "wb");
    if (f == nullptr || std::fwrite(text->data(), 1, text->size(), f) != text->size() ||
        std::fclose(f) != 0) {
      return absl::InternalError(absl::StrCat("cannot write ", out, suffix));
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace megatrain::engine

int main(int argc, char** argv) {
  if (argc != 5 && argc != 7) {
    std::fprintf(stderr, "usage: %s PREFIX W STEPS MODE [KILL_RANK KILL_STEP]\n", argv[0]);
    return 2;
  }
  const absl::Status s = megatrain::engine::Run(argv[1], std::atoi(argv[2]), std::atoi(argv[3]),
                                                argv[4], argc == 7 ? std::atoi(argv[5]) : -1,
                                                argc == 7 ? std::atoi(argv[6]) : -1);
  if (!s.ok()) {
    std::fprintf(stderr, "dp_exactness_worker: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
