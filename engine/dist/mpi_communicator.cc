// The Communicator over MPI_COMM_WORLD (see mpi_communicator.h).
#include "engine/dist/mpi_communicator.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"

namespace megatrain::engine::dist {
namespace {

// One collective call: under the watchdog's deadline, and its seconds added to the stats when it
// ends.
class CallTimer {
 public:
  CallTimer(CommunicatorStats& stats, CollectiveWatchdog& watchdog, const char* collective)
      : stats_(stats), watched_(watchdog, collective), t0_(std::chrono::steady_clock::now()) {}
  ~CallTimer() {
    stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  CommunicatorStats& stats_;
  WatchedCollective watched_;
  std::chrono::steady_clock::time_point t0_;
};

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "(unknown host)";
  return name;
}

// Ends the process when `what` has not completed within `timeout` (zero: never). MPI's start-up
// (MPI_Init_thread, the split by machine) waits for every rank, and no collective's watchdog
// covers it: a rank that never starts would keep the others (and the launcher) waiting forever.
// Exiting lets mpirun end the job.
class ProcessDeadline {
 public:
  ProcessDeadline(std::chrono::seconds timeout, std::string what) {
    if (timeout.count() <= 0) return;
    thread_ = std::thread([this, timeout, what = std::move(what)] {
      std::unique_lock<std::mutex> lock(mu_);
      if (done_cv_.wait_for(lock, timeout, [this] { return done_; })) return;
      std::fprintf(stderr,
                   "error: %s did not complete within %lld s (a rank did not start, stopped, or "
                   "hung); exiting\n",
                   what.c_str(), static_cast<long long>(timeout.count()));
      std::fflush(stderr);
      _exit(1);
    });
  }
  ProcessDeadline(const ProcessDeadline&) = delete;
  ProcessDeadline& operator=(const ProcessDeadline&) = delete;
  ~ProcessDeadline() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    done_cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace

bool LaunchedByMpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
}

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::Create(
    const MpiCommunicatorOptions& options) {
  if (options.collective_timeout.count() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("collective_timeout=",
                                                   options.collective_timeout.count(),
                                                   " s must be >= 0 (0 = no deadline)"));
  }
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    return absl::FailedPreconditionError("MPI is already initialized in this process");
  }
  std::optional<ProcessDeadline> startup;
  startup.emplace(options.collective_timeout,
                  absl::StrCat("MPI start-up on host ", HostName()));
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
    return absl::UnavailableError("MPI_Init_thread failed (launched by mpirun?)");
  }
  if (provided < MPI_THREAD_SERIALIZED) {
    MPI_Finalize();
    return absl::UnavailableError(absl::StrCat(
        "this MPI library gives thread level ", provided, ", below MPI_THREAD_SERIALIZED (",
        MPI_THREAD_SERIALIZED, "), which a reduce-scatter from a device's stream thread needs"));
  }
  // Errors come back as codes we turn into a Status naming the call. A rank that dies is
  // handled by the launcher: mpirun aborts the whole job (docs/scale_out.md).
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // The ranks sharing this machine (its memory, and so its GPUs), whatever the launcher: MPI
  // itself groups them, rather than a launcher's variable (OMPI_COMM_WORLD_LOCAL_RANK,
  // SLURM_LOCALID, ...).
  MPI_Comm node = MPI_COMM_NULL;
  int local_rank = 0, local_size = 0;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node) !=
          MPI_SUCCESS ||
      MPI_Comm_rank(node, &local_rank) != MPI_SUCCESS ||
      MPI_Comm_size(node, &local_size) != MPI_SUCCESS) {
    if (node != MPI_COMM_NULL) MPI_Comm_free(&node);
    MPI_Finalize();
    return absl::UnavailableError(absl::StrCat(
        "rank ", rank, " of ", size, ": MPI_Comm_split_type(shared) could not group this "
        "machine's ranks"));
  }
  MPI_Comm_free(&node);
  startup.reset();
  std::unique_ptr<MpiCommunicator> comm(new MpiCommunicator(rank, size, HostName()));
  comm->local_rank_ = local_rank;
  comm->local_size_ = local_size;
  MpiCommunicator* self = comm.get();
  comm->watchdog_ = std::make_unique<CollectiveWatchdog>(
      options.collective_timeout,
      [self](const CollectiveWatchdog::Overdue& overdue) { self->AbortOverdue(overdue); });
  return comm;
}

MpiCommunicator::~MpiCommunicator() {
  watchdog_.reset();  // no report may race MPI_Finalize
  // No deadline here: the other ranks may wait in it for rank 0's last checkpoint, which may
  // legitimately take longer than any collective (docs/scale_out.md).
  MPI_Finalize();
}

void MpiCommunicator::AbortOverdue(const CollectiveWatchdog::Overdue& overdue) {
  // A blocking collective cannot say which rank it waits for; this rank can say where it is.
  const std::string step = overdue.step.has_value() ? absl::StrCat(" at step ", *overdue.step)
                                                    : std::string(" before the first step");
  const std::string not_running =
      overdue.not_running.count() > 0
          ? absl::StrCat(" (after this rank itself did not run for ", overdue.not_running.count(),
                         " s, not counted)")
          : std::string();
  std::fprintf(stderr,
               "\nerror: rank %d of %d on host %s: collective %s%s did not complete within %lld "
               "s%s; waiting for another rank (stopped, hung, or slower than the collective "
               "timeout allows); aborting the job\n",
               rank_, size_, host_.c_str(), overdue.collective.c_str(), step.c_str(),
               static_cast<long long>(overdue.timeout.count()), not_running.c_str());
  std::fflush(stderr);
  // From the watchdog's thread while the main thread is inside MPI: Open MPI's abort goes
  // through the launcher's out-of-band channel, which kills every rank.
  Abort(1);
}

void MpiCommunicator::Abort(int exit_code) {
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; should it, still end this rank
}

absl::Status MpiCommunicator::Check(int code, const char* call) const {
  if (code == MPI_SUCCESS) return absl::OkStatus();
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return absl::UnavailableError(absl::StrCat("rank ", rank_, " of ", size_, ": ", call,
                                             " failed: ", std::string(text, length)));
}

absl::StatusOr<int64_t> MpiCommunicator::SumInt64(int64_t value) {
  CallTimer timer(stats_, *watchdog_, "MPI_Allreduce(int64 sum)");
  long long in = value, out = 0;
  if (absl::Status s = Check(MPI_Allreduce(&in, &out, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD),
                             "MPI_Allreduce(int64 sum)");
      !s.ok()) {
    return s;
  }
  stats_.bytes_sent += sizeof(in);
  return static_cast<int64_t>(out);
}

absl::StatusOr<std::vector<double>> MpiCommunicator::AllGatherDoubles(
    absl::Span<const double> values) {
  CallTimer timer(stats_, *watchdog_, "MPI_Allgather(doubles)");
  if (values.size() > static_cast<size_t>(INT_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat("AllGatherDoubles: ", values.size(),
                                                   " values per rank is over MPI's int count"));
  }
  std::vector<double> all(values.size() * static_cast<size_t>(size_));
  const int count = static_cast<int>(values.size());
  if (absl::Status s = Check(MPI_Allgather(values.data(), count, MPI_DOUBLE, all.data(), count,
                                           MPI_DOUBLE, MPI_COMM_WORLD),
                             "MPI_Allgather(doubles)");
      !s.ok()) {
    return s;
  }
  stats_.bytes_sent += values.size() * sizeof(double);
  return all;
}

absl::Status MpiCommunicator::ReduceFloatsInRankOrder(float* data, size_t n) {
  return ReduceInRankOrder(data, nullptr, n);
}

absl::Status MpiCommunicator::ReduceFloatPairsInRankOrder(float* data, const float* apart,
                                                          size_t n) {
  return ReduceInRankOrder(data, apart, n);
}

absl::Status MpiCommunicator::ReduceFloatsInRankOrderTo(float* data, size_t n, int root) {
  return ReduceInRankOrderTo(data, nullptr, n, root);
}

absl::Status MpiCommunicator::ReduceFloatPairsInRankOrderTo(float* data, const float* apart,
                                                            size_t n, int root) {
  return ReduceInRankOrderTo(data, apart, n, root);
}

absl::Status MpiCommunicator::ReduceInRankOrder(float* data, const float* apart, size_t n) {
  CallTimer timer(stats_, *watchdog_, "MPI_Alltoallv/MPI_Allgatherv(gradient reduction)");
  const int world = size_;
  // Contributions per rank: the rank's slab, and the array kept apart when there is one.
  const int per_rank = apart != nullptr ? 2 : 1;
  const float* sources[2] = {data, apart};
  std::vector<int> send_counts(world), send_displs(world), receive_counts(world),
      receive_displs(world);
  for (size_t first = 0; first < n; first += kPieceFloats) {
    const size_t piece = std::min(kPieceFloats, n - first);
    float* base = data + first;
    // Rank j owns range j of the piece: send it our contributions there; receive every rank's
    // contributions to our range, in rank order (a rank's two one after the other).
    const OwnedRange mine = OwnedRangeOf(piece, rank_, world);
    const size_t owned = mine.end - mine.begin;
    receive_.resize(owned * static_cast<size_t>(world * per_rank));
    for (int k = 0; k < per_rank; ++k) {
      for (int j = 0; j < world; ++j) {
        const OwnedRange theirs = OwnedRangeOf(piece, j, world);
        send_counts[j] = static_cast<int>(theirs.end - theirs.begin);
        send_displs[j] = static_cast<int>(theirs.begin);
        receive_counts[j] = static_cast<int>(owned);
        receive_displs[j] = static_cast<int>(owned * static_cast<size_t>(j * per_rank + k));
      }
      if (absl::Status s =
              Check(MPI_Alltoallv(sources[k] + first, send_counts.data(), send_displs.data(),
                                  MPI_FLOAT, receive_.data(), receive_counts.data(),
                                  receive_displs.data(), MPI_FLOAT, MPI_COMM_WORLD),
                    "MPI_Alltoallv(gradient contributions)");
          !s.ok()) {
        return s;
      }
    }
    SumInRankOrder(receive_.data(), world * per_rank, owned, base + mine.begin);
    for (int j = 0; j < world; ++j) {
      const OwnedRange theirs = OwnedRangeOf(piece, j, world);
      receive_counts[j] = static_cast<int>(theirs.end - theirs.begin);
      receive_displs[j] = static_cast<int>(theirs.begin);
    }
    if (absl::Status s =
            Check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, base, receive_counts.data(),
                                 receive_displs.data(), MPI_FLOAT, MPI_COMM_WORLD),
                  "MPI_Allgatherv(reduced gradients)");
        !s.ok()) {
      return s;
    }
    // Sent: every range but ours of each array in the all-to-all, then ours to every other rank.
    stats_.bytes_sent +=
        ((piece - owned) * static_cast<size_t>(per_rank) + owned * static_cast<size_t>(world - 1)) *
        sizeof(float);
  }
  return absl::OkStatus();
}

absl::Status MpiCommunicator::ReduceScatterFloatsInRankOrder(const float* send, float* recv,
                                                             size_t shard) {
  CallTimer timer(stats_, *watchdog_, "MPI_Alltoall(reduce-scatter)");
  const size_t world = static_cast<size_t>(size_);
  const size_t most = std::max<size_t>(1, kPieceFloats / world);
  for (size_t first = 0; first < shard; first += most) {
    const size_t piece = std::min(most, shard - first);
    // Block j of the piece is what rank j sums: staged first, so an in-place recv (our own block
    // of send) is only written after every block of this piece has left.
    staged_.resize(piece * world);
    for (size_t j = 0; j < world; ++j) {
      std::memcpy(staged_.data() + j * piece, send + j * shard + first, piece * sizeof(float));
    }
    receive_.resize(piece * world);
    if (absl::Status s = Check(MPI_Alltoall(staged_.data(), static_cast<int>(piece), MPI_FLOAT,
                                            receive_.data(), static_cast<int>(piece), MPI_FLOAT,
                                            MPI_COMM_WORLD),
                               "MPI_Alltoall(reduce-scatter)");
        !s.ok()) {
      return s;
    }
    SumInRankOrder(receive_.data(), size_, piece, recv + first);
    stats_.bytes_sent += piece * (world - 1) * sizeof(float);
  }
  return absl::OkStatus();
}

absl::Status MpiCommunicator::AllGatherFloatShards(float* data, size_t n) {
  CallTimer timer(stats_, *watchdog_, "MPI_Allgather(gradient shards)");
  const size_t world = static_cast<size_t>(size_);
  const size_t shard = (n + world - 1) / world;
  const size_t most = std::max<size_t>(1, kPieceFloats / world);
  // Rank j's floats [j * shard, min(n, (j + 1) * shard)): how many of them from `first` on.
  const auto span = [&](size_t j, size_t first, size_t piece) -> size_t {
    const size_t begin = std::min(n, j * shard + first);
    return std::min(n, j * shard + first + piece) - begin;
  };
  for (size_t first = 0; first < shard; first += most) {
    const size_t piece = std::min(most, shard - first);
    staged_.assign(piece, 0.0f);
    const size_t mine = span(static_cast<size_t>(rank_), first, piece);
    if (mine > 0) {
      std::memcpy(staged_.data(), data + static_cast<size_t>(rank_) * shard + first,
                  mine * sizeof(float));
    }
    receive_.resize(piece * world);
    if (absl::Status s = Check(MPI_Allgather(staged_.data(), static_cast<int>(piece), MPI_FLOAT,
                                             receive_.data(), static_cast<int>(piece), MPI_FLOAT,
                                             MPI_COMM_WORLD),
                               "MPI_Allgather(gradient shards)");
        !s.ok()) {
      return s;
    }
    for (size_t j = 0; j < world; ++j) {
      const size_t count = span(j, first, piece);
      if (j == static_cast<size_t>(rank_) || count == 0) continue;
      std::memcpy(data + j * shard + first, receive_.data() + j * piece, count * sizeof(float));
    }
    stats_.bytes_sent += piece * (world - 1) * sizeof(float);
  }
  return absl::OkStatus();
}

absl::Status MpiCommunicator::ReduceInRankOrderTo(float* data, const float* apart, size_t n,
                                                  int root) {
  CallTimer timer(stats_, *watchdog_, "MPI_Gatherv(gradient contributions)");
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank_, ": reduce root ", root, " outside a world of ", size_));
  }
  const bool is_root = rank_ == root;
  const int per_rank = apart != nullptr ? 2 : 1;
  const float* sources[2] = {data, apart};
  std::vector<int> receive_counts(size_), receive_displs(size_);
  // Root gathers W x per_rank pieces at once: smaller pieces for large worlds keep its buffer
  // within 2^26 floats and every displacement an int (the sums are elementwise in rank order
  // whatever the piece).
  const size_t contributions = static_cast<size_t>(size_) * static_cast<size_t>(per_rank);
  const size_t piece_floats =
      std::max<size_t>(1, std::min(kRootPieceFloats, (size_t{1} << 26) / contributions));
  for (size_t first = 0; first < n; first += piece_floats) {
    const size_t piece = std::min(piece_floats, n - first);
    float* base = data + first;
    if (is_root) receive_.resize(piece * static_cast<size_t>(size_ * per_rank));
    for (int k = 0; k < per_rank; ++k) {
      // Root lays rank j's contribution k at slot j * per_rank + k: rank order, pairs together.
      for (int j = 0; j < size_; ++j) {
        receive_counts[j] = static_cast<int>(piece);
        receive_displs[j] = static_cast<int>(piece * static_cast<size_t>(j * per_rank + k));
      }
      if (absl::Status s =
              Check(MPI_Gatherv(sources[k] + first, static_cast<int>(piece), MPI_FLOAT,
                                is_root ? receive_.data() : nullptr, receive_counts.data(),
                                receive_displs.data(), MPI_FLOAT, root, MPI_COMM_WORLD),
                    "MPI_Gatherv(gradient contributions)");
          !s.ok()) {
        return s;
      }
    }
    if (is_root) {
      SumInRankOrder(receive_.data(), size_ * per_rank, piece, base);
    } else {
      stats_.bytes_sent += piece * static_cast<size_t>(per_rank) * sizeof(float);
    }
  }
  return absl::OkStatus();
}

absl::Status MpiCommunicator::Broadcast(void* data, size_t bytes, int root) {
  CallTimer timer(stats_, *watchdog_, "MPI_Bcast");
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank_, ": broadcast root ", root, " outside a world of ", size_));
  }
  char* p = static_cast<char*>(data);
  for (size_t done = 0; done < bytes;) {
    const int chunk = static_cast<int>(std::min<size_t>(bytes - done, size_t{1} << 30));
    if (absl::Status s =
            Check(MPI_Bcast(p + done, chunk, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
        !s.ok()) {
      return s;
    }
    done += static_cast<size_t>(chunk);
  }
  if (rank_ == root && size_ > 1) stats_.bytes_sent += bytes;  // a world of one sends nothing
  return absl::OkStatus();
}

absl::Status MpiCommunicator::Barrier() {
  CallTimer timer(stats_, *watchdog_, "MPI_Barrier");
  return Check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
}

}  // namespace megatrain::engine::dist
