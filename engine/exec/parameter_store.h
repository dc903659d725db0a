// Host home of every parameter: per layout entry one contiguous fp32 master
// buffer, AdamW m and v, and a gradient slab. On the CPU device the fp32
// master is also the compute copy the weights stream from.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/device/device.h"
#include "engine/optimizer/host_adamw.h"

namespace megatrain::engine {

struct EntrySpec {
  size_t elements = 0;                 // padded element count of the packed buffer
  std::vector<AdamwSegment> segments;  // tensors, with their AdamW group
};

struct EntryBuffers {
  float* master = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  float* grad = nullptr;
  size_t elements = 0;
};

class ParameterStore {
 public:
  // Master and gradient slabs are pinned (they are the copy endpoints), m and
  // v pageable; all zero-initialised.
  static absl::StatusOr<ParameterStore> Create(Device& device, std::vector<EntrySpec> entries);

  ParameterStore(ParameterStore&&) = default;
  ParameterStore& operator=(ParameterStore&&) = default;

  int num_entries() const { return static_cast<int>(specs_.size()); }
  const EntrySpec& spec(int entry) const { return specs_[entry]; }
  EntryBuffers entry(int entry) const;
  size_t total_elements() const;
  // Host bytes this store holds (master + m + v + grad).
  size_t host_bytes() const { return total_elements() * sizeof(float) * 4; }

 private:
  struct PageableDeleter {
    void operator()(float* p) const;
  };
  ParameterStore() = default;

  std::vector<EntrySpec> specs_;
  std::vector<PinnedHostBuffer> master_;
  std::vector<PinnedHostBuffer> grad_;
  std::vector<std::unique_ptr<float, PageableDeleter>> m_;
  std::vector<std::unique_ptr<float, PageableDeleter>> v_;
};

}  // namespace megatrain::engine
