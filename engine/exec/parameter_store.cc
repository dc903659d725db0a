// ParameterStore allocation and tier-aware access to the optimizer state.
#include "engine/exec/parameter_store.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/common/huge_pages.h"
#include "kernels/common/bf16.h"

namespace megatrain::engine {

void ParameterStore::FreeDeleter::operator()(float* p) const { std::free(p); }

absl::StatusOr<ParameterStore::HostArray> ParameterStore::AllocateArray(Device& device,
                                                                        size_t elements,
                                                                        bool pinned) {
  HostArray array;
  const size_t bytes = elements * sizeof(float);
  if (pinned) {
    absl::StatusOr<PinnedHostBuffer> buffer = device.AllocatePinned(bytes);
    if (!buffer.ok()) return buffer.status();
    array.pinned = std::move(*buffer);
  } else {
    // Big arrays (AdamW m and v) on huge pages: see engine/common/huge_pages.h.
    float* p = static_cast<float*>(AllocateStreamingArray(bytes, 64));
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes, " bytes of host RAM"));
    }
    array.pageable.reset(p);
  }
  if (bytes > 0) std::memset(array.data(), 0, bytes);
  return array;
}

absl::StatusOr<ParameterStore> ParameterStore::Create(Device& device,
                                                      std::vector<EntrySpec> entries,
                                                      const StorePlacement& placement) {
  if (placement.compute_copy_bf16 && placement.compute_copy_fp32) {
    return absl::InvalidArgumentError(
        "compute_copy_bf16 and compute_copy_fp32 are exclusive: one compute copy per device");
  }
  if (placement.master_on_nvme && !placement.states_on_nvme) {
    return absl::InvalidArgumentError(
        "master_on_nvme needs states_on_nvme: the master streams with m and v");
  }
  if (placement.master_on_nvme && !placement.compute_copy_bf16 && !placement.compute_copy_fp32) {
    return absl::InvalidArgumentError(
        "master_on_nvme needs a compute copy (compute_copy_bf16 or compute_copy_fp32): the "
        "weights stream from it, never from the NVMe tier");
  }
  ParameterStore store;
  store.specs_ = std::move(entries);
  store.placement_ = placement;
  for (size_t i = 0; i < store.specs_.size(); ++i) {
    const size_t n = store.specs_[i].elements;
    struct Wanted {
      std::vector<HostArray>* list;
      bool pinned;
      const char* kind;
    };
    std::vector<Wanted> wanted = {{&store.grad_, placement.grad_pinned, "gradient"}};
    if (!placement.master_on_nvme) {
      wanted.push_back({&store.master_, placement.master_pinned, "master"});
    }
    if (!placement.states_on_nvme) {
      wanted.push_back({&store.m_, false, "adam_m"});
      wanted.push_back({&store.v_, false, "adam_v"});
    }
    if (placement.compute_copy_bf16 || placement.compute_copy_fp32) {
      // bf16: two values per float of storage.
      const size_t floats = placement.compute_copy_bf16 ? (n + 1) / 2 : n;
      absl::StatusOr<HostArray> array = AllocateArray(device, floats, /*pinned=*/true);
      if (!array.ok()) {
        return absl::Status(
            array.status().code(),
            absl::StrCat("parameter entry ", i, " compute copy: ", array.status().message()));
      }
      store.compute_.push_back(std::move(*array));
    }
    for (const Wanted& w : wanted) {
      absl::StatusOr<HostArray> array = AllocateArray(device, n, w.pinned);
      if (!array.ok()) {
        return absl::Status(array.status().code(), absl::StrCat("parameter entry ", i, " ", w.kind,
                                                                ": ", array.status().message()));
      }
      w.list->push_back(std::move(*array));
    }
  }
  if (placement.states_on_nvme) {
    tiers::BlockIo* io = placement.block_io;
    if (io == nullptr) {
      absl::StatusOr<std::unique_ptr<tiers::UringBlockIo>> own = tiers::UringBlockIo::Create();
      if (!own.ok()) return own.status();
      store.io_ = std::move(*own);
      io = store.io_.get();
    }
    tiers::NvmeStateStoreOptions options;
    options.dir = placement.nvme_dir;
    options.arrays_per_entry = placement.master_on_nvme ? 3 : 2;
    options.read_ahead = placement.read_ahead;
    options.max_writes_in_flight = placement.max_writes_in_flight;
    options.request_bytes = placement.nvme_request_bytes;
    std::vector<size_t> elements;
    for (const EntrySpec& s : store.specs_) elements.push_back(s.elements);
    absl::StatusOr<std::unique_ptr<tiers::NvmeStateStore>> state =
        tiers::NvmeStateStore::Create(*io, options, std::move(elements));
    if (!state.ok()) return state.status();
    store.state_store_ = std::move(*state);
  }
  return store;
}

EntryBuffers ParameterStore::entry(int i) const {
  EntryBuffers b;
  if (!master_.empty()) b.master = master_[i].data();
  b.grad = grad_[i].data();
  if (placement_.compute_copy_bf16) {
    b.compute_bf16 = reinterpret_cast<uint16_t*>(compute_[i].data());
  }
  if (placement_.compute_copy_fp32) b.compute_fp32 = compute_[i].data();
  if (!m_.empty()) {
    b.m = m_[i].data();
    b.v = v_[i].data();
  }
  b.elements = specs_[i].elements;
  return b;
}

size_t ParameterStore::total_elements() const {
  size_t n = 0;
  for (const auto& s : specs_) n += s.elements;
  return n;
}

absl::Status ParameterStore::ReadOptimizerState(int e, float* m, float* v) const {
  const size_t bytes = specs_[e].elements * sizeof(float);
  if (state_store_ == nullptr) {
    std::memcpy(m, m_[e].data(), bytes);
    std::memcpy(v, v_[e].data(), bytes);
    return absl::OkStatus();
  }
  absl::StatusOr<tiers::StagedEntry> staged = state_store_->Acquire(e);
  if (!staged.ok()) return staged.status();
  std::memcpy(m, staged->array(0), bytes);
  std::memcpy(v, staged->array(1), bytes);
  return state_store_->Release(e, /*dirty=*/false);
}

absl::Status ParameterStore::WriteOptimizerState(int e, const float* m, const float* v) {
  const size_t bytes = specs_[e].elements * sizeof(float);
  if (state_store_ == nullptr) {
    std::memcpy(m_[e].data(), m, bytes);
    std::memcpy(v_[e].data(), v, bytes);
    return absl::OkStatus();
  }
  absl::StatusOr<tiers::StagedEntry> staged = state_store_->Acquire(e);
  if (!staged.ok()) return staged.status();
  std::memcpy(staged->array(0), m, bytes);
  std::memcpy(staged->array(1), v, bytes);
  return state_store_->Release(e, /*dirty=*/true);
}

absl::Status ParameterStore::ReadMaster(int e, float* master) const {
  const size_t bytes = specs_[e].elements * sizeof(float);
  if (!placement_.master_on_nvme) {
    std::memcpy(master, master_[e].data(), bytes);
    return absl::OkStatus();
  }
  absl::StatusOr<tiers::StagedEntry> staged = state_store_->Acquire(e);
  if (!staged.ok()) return staged.status();
  std::memcpy(master, staged->array(kMasterArray), bytes);
  return state_store_->Release(e, /*dirty=*/false);
}

absl::Status ParameterStore::WriteMaster(int e, const float* master) {
  const size_t bytes = specs_[e].elements * sizeof(float);
  if (!placement_.master_on_nvme) {
    std::memcpy(master_[e].data(), master, bytes);
    WriteComputeCopy(e, master);
    return absl::OkStatus();
  }
  absl::StatusOr<tiers::StagedEntry> staged = state_store_->Acquire(e);
  if (!staged.ok()) return staged.status();
  std::memcpy(staged->array(kMasterArray), master, bytes);
  WriteComputeCopy(e, master);
  return state_store_->Release(e, /*dirty=*/true);
}

void ParameterStore::WriteComputeCopy(int e, const float* master) {
  if (compute_.empty()) return;
  const size_t n = specs_[e].elements;
  if (placement_.compute_copy_fp32) {
    std::memcpy(compute_[e].data(), master, n * sizeof(float));
    return;
  }
  uint16_t* copy = reinterpret_cast<uint16_t*>(compute_[e].data());
  for (size_t j = 0; j < n; ++j) copy[j] = kernels::Float32ToBf16Bits(master[j]);
}

void ParameterStore::RefreshComputeCopy() {
  if (master_.empty()) return;  // on NVMe: every write went through WriteMaster
  for (size_t e = 0; e < compute_.size(); ++e) {
    WriteComputeCopy(static_cast<int>(e), master_[e].data());
  }
}

absl::Status ParameterStore::Flush() {
  return state_store_ == nullptr ? absl::OkStatus() : state_store_->Flush();
}

size_t ParameterStore::pageable_ram_bytes() const {
  size_t bytes = state_store_ != nullptr ? state_store_->staging_bytes() : 0;
  for (const std::vector<HostArray>* list : {&master_, &grad_, &m_, &v_}) {
    for (size_t e = 0; e < list->size(); ++e) {
      if ((*list)[e].pinned.empty()) bytes += specs_[e].elements * sizeof(float);
    }
  }
  return bytes;
}

}  // namespace megatrain::engine
