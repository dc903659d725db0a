// The ZeRO-1 ownership table (see zero1_shards.h).
#include "engine/exec/zero1_shards.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/common/fatal.h"

namespace megatrain::engine {

Zero1Shards::Zero1Shards(const EntryChunks& chunks, int world) : world_(world) {
  if (world < 1) internal::DieBecause(absl::StrCat("Zero1Shards: world ", world));
  size_t total = 0;
  for (int e = 0; e < chunks.num_entries(); ++e) total += chunks.entry_elements(e);
  ranges_.assign(chunks.num_entries(), std::vector<ElementRange>(world));
  size_t before = 0;  // elements of the units before this one
  for (int e = 0; e < chunks.num_entries(); ++e) {
    for (int c = 0; c < chunks.num_chunks(e); ++c) {
      const EntryChunk chunk = chunks.chunk(e, c);
      // The middle element's share, in integers: floor(world * (before + count/2) / total).
      const size_t middle = before + chunk.count / 2;
      const size_t share =
          total == 0 ? 0
                     : static_cast<size_t>(
                           (static_cast<unsigned __int128>(middle) * static_cast<unsigned>(world)) /
                           total);
      const int owner = static_cast<int>(std::min<size_t>(share, static_cast<size_t>(world - 1)));
      ElementRange& r = ranges_[e][owner];
      // Shares grow with `middle`, so a rank's chunks of one entry are consecutive.
      if (r.count == 0) r.first = chunk.first;
      if (r.end() != chunk.first) {
        internal::DieBecause(absl::StrCat("Zero1Shards: entry ", e, " chunk ", c, " is not next"));
      }
      r.count += chunk.count;
      before += chunk.count;
    }
  }
}

std::vector<ElementRange> Zero1Shards::ranges_of(int rank) const {
  std::vector<ElementRange> out;
  out.reserve(ranges_.size());
  for (const std::vector<ElementRange>& entry : ranges_) out.push_back(entry[rank]);
  return out;
}

int Zero1Shards::owner_of(int entry, size_t element) const {
  for (int r = 0; r < world_; ++r) {
    const ElementRange& range = ranges_[entry][r];
    if (element >= range.first && element < range.end()) return r;
  }
  internal::DieBecause(
      absl::StrCat("Zero1Shards: element ", element, " of entry ", entry, " has no owner"));
}

}  // namespace megatrain::engine
