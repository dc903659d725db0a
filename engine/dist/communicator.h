// The Communicator: what a data-parallel trainer needs of its peer processes (ranks), with
// results that never depend on timing or on how the transport orders its arithmetic. MPI
// implements it across processes (mpi_communicator.h); SingleProcessCommunicator is the world of
// one, so the trainer has one code path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace megatrain::engine::dist {

// Totals since the communicator was made: payload bytes this rank sent, and wall time inside
// collective calls (waiting for slower ranks included).
struct CommunicatorStats {
  uint64_t bytes_sent = 0;
  double seconds = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // The sum over ranks of one integer per rank (exact: integers).
  virtual absl::StatusOr<int64_t> SumInt64(int64_t value) = 0;
  // Every rank's `values` (the same count on every rank), concatenated in rank order.
  virtual absl::StatusOr<std::vector<double>> AllGatherDoubles(absl::Span<const double> values) = 0;
  // data[0, n) (the same n on every rank) becomes, on every rank, the rank-ordered float sum
  // ((x_0 + x_1) + x_2) + ... element by element: the same bits as a single process adding the
  // ranks' contributions in that order, and the same bits on every rank. Never a transport's
  // reduction, whose order is unspecified (MPI_Allreduce on floats).
  virtual absl::Status ReduceFloatsInRankOrder(float* data, size_t n) = 0;
  // The same rank-ordered sum, delivered to rank `root` only (ZeRO-1: the range's owner is the
  // one rank that needs its reduced gradient). The other ranks' data is left as it was.
  virtual absl::Status ReduceFloatsInRankOrderTo(float* data, size_t n, int root) = 0;
  // Two contributions per rank, `data` then `apart` (n floats each, the same n on every rank):
  // data[0, n) becomes, on every rank, ((((d_0 + a_0) + d_1) + a_1) + d_2) + ... element by
  // element, the bits of one process adding, micro-batch by micro-batch, first one contribution and
  // then the other into one slab (a tied embedding: the LM head's gradient, then the rows'
  // scatter, which a rank keeps apart; docs/scale_out.md). `apart` is only read.
  virtual absl::Status ReduceFloatPairsInRankOrder(float* data, const float* apart, size_t n) = 0;
  // The same sum of pairs, delivered to rank `root` only (ZeRO-1); the other ranks' data is left
  // as it was.
  virtual absl::Status ReduceFloatPairsInRankOrderTo(float* data, const float* apart, size_t n,
                                                     int root) = 0;
  // A reduce-scatter in rank order: rank r's recv[0, shard) becomes the rank-ordered float sum
  // over every rank q of send_q[r * shard, (r + 1) * shard) (send: shard * size() floats, the
  // same shard on every rank). recv may be send + r * shard (in place; the rest of send is left
  // as it was) or a buffer of its own. Safe to call from a thread other than the one that made
  // the communicator, as long as no other call runs at the same time (a device's stream thread
  // while the trainer's thread waits for it: CommunicatorDeviceReduction).
  virtual absl::Status ReduceScatterFloatsInRankOrder(const float* send, float* recv,
                                                      size_t shard) = 0;
  // The inverse's data movement: data[0, n) is cut into size() shards of ceil(n / size()) floats
  // (the last ones shorter or empty), rank r holding the reduced shard r; afterwards every rank
  // holds all of them. Byte copies: every rank gets the same bits.
  virtual absl::Status AllGatherFloatShards(float* data, size_t n) = 0;
  // `bytes` at `data` on rank `root` are copied to every other rank's `data`.
  virtual absl::Status Broadcast(void* data, size_t bytes, int root) = 0;
  virtual absl::Status Barrier() = 0;

  virtual CommunicatorStats stats() const = 0;
  // The optimizer step the following collectives belong to: only for diagnostics (an overdue
  // collective's report names it; MpiCommunicator's collective deadline).
  virtual void NoteStep(uint64_t step) { (void)step; }
};

// The world of one process: every collective is the identity.
class SingleProcessCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  absl::StatusOr<int64_t> SumInt64(int64_t value) override { return value; }
  absl::StatusOr<std::vector<double>> AllGatherDoubles(absl::Span<const double> values) override {
    return std::vector<double>(values.begin(), values.end());
  }
  absl::Status ReduceFloatsInRankOrder(float*, size_t) override { return absl::OkStatus(); }
  absl::Status ReduceFloatsInRankOrderTo(float*, size_t, int root) override {
    if (root != 0) return absl::InvalidArgumentError("reduce root must be 0 in a world of 1");
    return absl::OkStatus();
  }
  // d_0 + a_0, element by element.
  absl::Status ReduceFloatPairsInRankOrder(float* data, const float* apart, size_t n) override;
  absl::Status ReduceFloatPairsInRankOrderTo(float* data, const float* apart, size_t n,
                                             int root) override;
  // recv = send (a copy unless in place).
  absl::Status ReduceScatterFloatsInRankOrder(const float* send, float* recv,
                                              size_t shard) override;
  absl::Status AllGatherFloatShards(float*, size_t) override { return absl::OkStatus(); }
  absl::Status Broadcast(void*, size_t, int root) override {
    if (root != 0) return absl::InvalidArgumentError("broadcast root must be 0 in a world of 1");
    return absl::OkStatus();
  }
  absl::Status Barrier() override { return absl::OkStatus(); }
  CommunicatorStats stats() const override { return {}; }
};

// The contiguous range of n elements that `rank` of `world` owns in ReduceFloatsInRankOrder:
// [begin, end) with sizes differing by at most one.
struct OwnedRange {
  size_t begin = 0;
  size_t end = 0;
};
OwnedRange OwnedRangeOf(size_t n, int rank, int world);

// Adds `contributions` (count arrays of n floats, in rank order) into out[0, n) in that order:
// out = c_0; out += c_1; ... The one place the rank-ordered float sum is written.
void SumInRankOrder(const float* contributions, int count, size_t n, float* out);

}  // namespace megatrain::engine::dist
