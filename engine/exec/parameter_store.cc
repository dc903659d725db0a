// ParameterStore allocation.
#include "engine/exec/parameter_store.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace megatrain::engine {

void ParameterStore::PageableDeleter::operator()(float* p) const { std::free(p); }

absl::StatusOr<ParameterStore> ParameterStore::Create(Device& device,
                                                      std::vector<EntrySpec> entries) {
  ParameterStore store;
  store.specs_ = std::move(entries);
  for (size_t i = 0; i < store.specs_.size(); ++i) {
    const size_t bytes = store.specs_[i].elements * sizeof(float);
    for (auto* list : {&store.master_, &store.grad_}) {
      absl::StatusOr<PinnedHostBuffer> buffer = device.AllocatePinned(bytes);
      if (!buffer.ok()) {
        return absl::Status(buffer.status().code(),
                            absl::StrCat("parameter entry ", i, ": ", buffer.status().message()));
      }
      std::memset(buffer->data(), 0, bytes);
      list->push_back(std::move(*buffer));
    }
    for (auto* list : {&store.m_, &store.v_}) {
      const size_t rounded = (bytes + 63) / 64 * 64;
      float* p = static_cast<float*>(std::aligned_alloc(64, rounded == 0 ? 64 : rounded));
      if (p == nullptr) {
        return absl::ResourceExhaustedError(
            absl::StrCat("parameter entry ", i, ": cannot allocate ", bytes, " bytes of host RAM"));
      }
      std::memset(p, 0, rounded);
      list->emplace_back(p);
    }
  }
  return store;
}

EntryBuffers ParameterStore::entry(int i) const {
  return EntryBuffers{master_[i].data_as<float>(), m_[i].get(), v_[i].get(),
                      grad_[i].data_as<float>(), specs_[i].elements};
}

size_t ParameterStore::total_elements() const {
  size_t n = 0;
  for (const auto& s : specs_) n += s.elements;
  return n;
}

}  // namespace megatrain::engine
