// Zero1Shards: which rank of a ZeRO-1 world owns (holds m and v of, reduces the gradient to,
// updates and broadcasts) which elements of every parameter-store entry (docs/scale_out.md).
//
// The unit of ownership is the store's chunk (EntryChunks: StorePlacement::nvme_chunk_bytes, the
// pieces NVMe traffic and the host optimizer work in), not the entry: the chunks, in unit order,
// go in contiguous runs to ranks 0, 1, ..., W-1, each chunk to the rank whose 1/W share of all
// elements holds the chunk's middle element. So a large entry (a 152k-vocabulary embedding) is
// split among ranks, every rank holds within one chunk of 1/W of each per-parameter array, and a
// rank's part of an entry is one contiguous range of whole chunks (possibly empty). Chunks start
// at multiples of the gradient norm's 64 Ki-element chunk, so each owner's norm partials are the
// ones one process computes (grad_norm.h). Every rank computes the same table.
#pragma once

#include <vector>

#include "engine/exec/entry_chunks.h"

namespace megatrain::engine {

class Zero1Shards {
 public:
  Zero1Shards() = default;  // no sharding: world() is 0
  Zero1Shards(const EntryChunks& chunks, int world);

  int world() const { return world_; }
  int num_entries() const { return static_cast<int>(ranges_.size()); }
  // Rank `rank`'s elements of entry `entry` (count 0 when it owns none of it).
  ElementRange range(int entry, int rank) const { return ranges_[entry][rank]; }
  // Every entry's range of one rank (StorePlacement::optimizer_state_ranges).
  std::vector<ElementRange> ranges_of(int rank) const;
  // The rank owning element `element` of entry `entry`.
  int owner_of(int entry, size_t element) const;

 private:
  int world_ = 0;
  std::vector<std::vector<ElementRange>> ranges_;  // [entry][rank]
};

}  // namespace megatrain::engine
