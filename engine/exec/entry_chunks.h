// EntryChunks: how the parameter store cuts its entries into the fixed-size
// chunks that NVMe traffic and the host optimizer work in, so NVMe staging is
// a constant (a few chunks) however large an entry is (a 152k-vocabulary
// embedding is just more chunks). Chunk c of entry e is unit base(e) + c of
// the NVMe files, elements [c * chunk_elements, ...) of the entry.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace megatrain::engine {

// Elements [first, first + count) of an entry.
struct ElementRange {
  size_t first = 0;
  size_t count = 0;
  size_t end() const { return first + count; }
  bool operator==(const ElementRange&) const = default;
};

struct EntryChunk {
  int unit = 0;      // index in the NVMe files' unit order (entries in order, chunks ascending)
  size_t first = 0;  // first element of the entry in the chunk
  size_t count = 0;  // elements in the chunk
};

class EntryChunks {
 public:
  EntryChunks() = default;
  EntryChunks(const std::vector<size_t>& entry_elements, size_t chunk_elements)
      : chunk_elements_(chunk_elements) {
    int unit = 0;
    for (size_t n : entry_elements) {
      base_.push_back(unit);
      elements_.push_back(n);
      unit += static_cast<int>(std::max<size_t>(1, (n + chunk_elements - 1) / chunk_elements));
    }
    base_.push_back(unit);
  }

  size_t chunk_elements() const { return chunk_elements_; }
  int num_entries() const { return static_cast<int>(elements_.size()); }
  size_t entry_elements(int entry) const { return elements_[entry]; }
  int num_units() const { return base_.empty() ? 0 : base_.back(); }
  int num_chunks(int entry) const { return base_[entry + 1] - base_[entry]; }
  EntryChunk chunk(int entry, int c) const {
    const size_t first = static_cast<size_t>(c) * chunk_elements_;
    return {base_[entry] + c, first, std::min(chunk_elements_, elements_[entry] - first)};
  }
  // Element counts of every unit, in unit order (what the NVMe files are laid out from).
  std::vector<size_t> unit_elements() const {
    std::vector<size_t> out;
    for (size_t e = 0; e < elements_.size(); ++e) {
      for (int c = 0; c < num_chunks(static_cast<int>(e)); ++c) {
        out.push_back(chunk(static_cast<int>(e), c).count);
      }
    }
    return out;
  }

 private:
  size_t chunk_elements_ = 1;
  std::vector<int> base_;  // first unit of each entry; one past the last at the end
  std::vector<size_t> elements_;
};

}  // namespace megatrain::engine
