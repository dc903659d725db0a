// ParameterStore allocation and tier-aware access to the optimizer state.
#include "engine/exec/parameter_store.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/common/huge_pages.h"
#include "engine/optimizer/grad_norm.h"
#include "engine/tiers/nvme_tier_files.h"
#include "kernels/common/bf16.h"

namespace megatrain::engine {

void ParameterStore::FreeDeleter::operator()(float* p) const { std::free(p); }

absl::StatusOr<ParameterStore::HostArray> ParameterStore::AllocateArray(Device& device,
                                                                        size_t elements,
                                                                        bool pinned) {
  HostArray array;
  array.elements = elements;
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
  if (placement.compute_copy_on_nvme && !placement.compute_copy_bf16 &&
      !placement.compute_copy_fp32) {
    return absl::InvalidArgumentError(
        "compute_copy_on_nvme needs a compute copy (compute_copy_bf16 or compute_copy_fp32)");
  }
  if (placement.master_on_nvme && !placement.compute_copy_bf16 && !placement.compute_copy_fp32) {
    return absl::InvalidArgumentError(
        "master_on_nvme needs a compute copy (compute_copy_bf16 or compute_copy_fp32): the "
        "weights stream from it, never from the NVMe tier");
  }
  static_assert(tiers::kNvmeChunkQuantumBytes == kGradNormChunkElements * sizeof(float));
  constexpr size_t kChunkQuantum = tiers::kNvmeChunkQuantumBytes;
  if (placement.nvme_chunk_bytes == 0 || placement.nvme_chunk_bytes % kChunkQuantum != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("nvme_chunk_bytes=", placement.nvme_chunk_bytes,
                     " must be a positive multiple of ", kChunkQuantum, " (256 KiB)"));
  }
  if (!placement.optimizer_state_ranges.empty()) {
    if (placement.optimizer_state_ranges.size() != entries.size()) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer_state_ranges has ",
                                                     placement.optimizer_state_ranges.size(),
                                                     " ranges for ", entries.size(), " entries"));
    }
    const size_t chunk_elements = placement.nvme_chunk_bytes / sizeof(float);
    for (size_t e = 0; e < entries.size(); ++e) {
      const ElementRange& r = placement.optimizer_state_ranges[e];
      if (r.count == 0) continue;
      // Whole chunks: the state file and the optimizer pass work in them.
      if (r.first % chunk_elements != 0 || r.end() > entries[e].elements ||
          (r.end() != entries[e].elements && r.end() % chunk_elements != 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("optimizer_state_ranges[", e, "] = [", r.first, ", ", r.end(),
                         ") is not whole chunks of ", chunk_elements,
                         " elements within the entry's ", entries[e].elements));
      }
    }
    // With the master on NVMe the state file holds only this rank's ranges of it; every rank
    // still needs every weight, which the fp32 compute copy in RAM holds bit for bit (the owners
    // broadcast it). A bf16 copy (a GPU) cannot give back the fp32 master a checkpoint's model
    // is written from, and a copy on NVMe cannot take a broadcast in place.
    if (placement.master_on_nvme &&
        (!placement.compute_copy_fp32 || placement.compute_copy_on_nvme)) {
      return absl::InvalidArgumentError(
          "optimizer_state_ranges (ZeRO-1 sharding) with master_on_nvme needs the fp32 compute "
          "copy (the CPU device's) in RAM, which holds every rank's full weights; a GPU's bf16 "
          "copy or a compute copy on NVMe is not supported yet: give the masters RAM");
    }
  }
  if (placement.alternate_state_regions && !placement.optimizer_state_ranges.empty()) {
    return absl::InvalidArgumentError(
        "alternate_state_regions (the speculative update) needs every entry's m and v, not "
        "ZeRO-1 optimizer_state_ranges");
  }
  if (placement.alternate_ram_state &&
      (placement.master_on_nvme || !placement.optimizer_state_ranges.empty() ||
       (placement.states_on_nvme && !placement.alternate_state_regions))) {
    return absl::InvalidArgumentError(
        "alternate_ram_state needs the master of every entry in RAM (not master_on_nvme), every "
        "entry's m and v (not ZeRO-1 optimizer_state_ranges), and with states_on_nvme the "
        "state file's alternate_state_regions for m and v");
  }
  ParameterStore store;
  store.specs_ = std::move(entries);
  store.placement_ = placement;
  std::vector<size_t> entry_elements;
  for (const EntrySpec& s : store.specs_) entry_elements.push_back(s.elements);
  const size_t chunk_elements = placement.nvme_chunk_bytes / sizeof(float);
  store.chunks_ = EntryChunks(entry_elements, chunk_elements);
  std::vector<bool> grad_in_ram(store.specs_.size(), !placement.grad_on_nvme);
  for (int e : placement.grad_ram_entries) {
    if (e < 0 || e >= static_cast<int>(store.specs_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("grad_ram_entries names entry ", e,
                                                     " of ", store.specs_.size()));
    }
    grad_in_ram[e] = true;
  }
  if (placement.rows_gradient_entry != -1) {
    const int e = placement.rows_gradient_entry;
    if (e < 0 || e >= static_cast<int>(store.specs_.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("rows_gradient_entry=", e, " names no entry of ", store.specs_.size()));
    }
    if (!grad_in_ram[e]) {
      return absl::InvalidArgumentError(
          absl::StrCat("rows_gradient_entry=", e,
                       ": that entry's gradient is on NVMe; the rows' gradient is "
                       "kept apart only beside a gradient in RAM (the embedding's)"));
    }
    absl::StatusOr<HostArray> rows =
        AllocateArray(device, store.specs_[e].elements, placement.grad_pinned);
    if (!rows.ok()) {
      return absl::Status(
          rows.status().code(),
          absl::StrCat("parameter entry ", e, " rows' gradient: ", rows.status().message()));
    }
    store.rows_grad_ = std::move(*rows);
  }
  std::vector<bool> copy_in_ram(store.specs_.size(), !placement.compute_copy_on_nvme);
  for (int e : placement.compute_copy_ram_entries) {
    if (e < 0 || e >= static_cast<int>(store.specs_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("compute_copy_ram_entries names entry ", e,
                                                     " of ", store.specs_.size()));
    }
    copy_in_ram[e] = true;
  }
  for (size_t i = 0; i < store.specs_.size(); ++i) {
    const size_t n = store.specs_[i].elements;
    struct Wanted {
      std::vector<HostArray>* list;
      bool pinned;
      const char* kind;
      size_t elements;
    };
    std::vector<Wanted> wanted;
    if (grad_in_ram[i]) {
      wanted.push_back({&store.grad_, placement.grad_pinned, "gradient", n});
    } else {
      store.grad_.emplace_back();  // on NVMe
    }
    if (!placement.master_on_nvme) {
      wanted.push_back({&store.master_, placement.master_pinned, "master", n});
    }
    if (!placement.states_on_nvme && store.has_optimizer_state(static_cast<int>(i))) {
      const size_t owned = store.optimizer_state_range(static_cast<int>(i)).count;
      wanted.push_back({&store.m_, false, "adam_m", owned});
      wanted.push_back({&store.v_, false, "adam_v", owned});
    } else if (!placement.states_on_nvme) {
      store.m_.emplace_back();  // another rank's shard: null
      store.v_.emplace_back();
    }
    if ((placement.compute_copy_bf16 || placement.compute_copy_fp32) && !copy_in_ram[i]) {
      store.compute_.emplace_back();  // on NVMe
    } else if (placement.compute_copy_bf16 || placement.compute_copy_fp32) {
      // bf16: two values per float of storage.
      const size_t floats = placement.compute_copy_bf16 ? (n + 1) / 2 : n;
      absl::StatusOr<HostArray> array =
          AllocateArray(device, floats, placement.compute_copy_pinned);
      if (!array.ok()) {
        return absl::Status(
            array.status().code(),
            absl::StrCat("parameter entry ", i, " compute copy: ", array.status().message()));
      }
      store.compute_.push_back(std::move(*array));
    }
    for (const Wanted& w : wanted) {
      absl::StatusOr<HostArray> array = AllocateArray(device, w.elements, w.pinned);
      if (!array.ok()) {
        return absl::Status(array.status().code(), absl::StrCat("parameter entry ", i, " ", w.kind,
                                                                ": ", array.status().message()));
      }
      w.list->push_back(std::move(*array));
    }
  }
  if (placement.alternate_ram_state) {
    if (absl::Status s = store.AllocateAlternates(device); !s.ok()) return s;
  }
  if (!placement.states_on_nvme && !placement.grad_on_nvme && !placement.compute_copy_on_nvme) {
    return store;
  }
  tiers::BlockIo* io = placement.block_io;
  if (io == nullptr) {
    absl::StatusOr<std::unique_ptr<tiers::UringBlockIo>> own = tiers::UringBlockIo::Create();
    if (!own.ok()) return own.status();
    store.io_ = std::move(*own);
    io = store.io_.get();
  }
  // A previous run's files free their space before the first reservation, whichever kinds this
  // run puts on NVMe (the daemon counts that space as free: service/memory_spec_validation.cc).
  if (absl::Status s = tiers::RemoveTierFiles(placement.nvme_dir); !s.ok()) return s;
  tiers::NvmeStateStoreOptions options;
  options.dir = placement.nvme_dir;
  options.read_ahead = placement.read_ahead;
  options.max_writes_in_flight = placement.max_writes_in_flight;
  options.request_bytes = placement.nvme_request_bytes;
  if (placement.states_on_nvme) {
    options.arrays_per_entry = placement.master_on_nvme ? 3 : 2;
    options.alternate_regions = placement.alternate_state_regions;
    // A ZeRO-1 rank's file holds its own ranges' chunks only: the others' units are empty (no
    // bytes, passed over by the read-ahead), so unit numbers stay the chunks' everywhere.
    std::vector<size_t> units = store.chunks_.unit_elements();
    for (int e = 0; e < store.num_entries(); ++e) {
      for (int c = 0; c < store.chunks_.num_chunks(e); ++c) {
        if (!store.holds_state_of(store.chunks_.chunk(e, c), e)) {
          units[store.chunks_.chunk(e, c).unit] = 0;
        }
      }
    }
    absl::StatusOr<std::unique_ptr<tiers::NvmeStateStore>> state =
        tiers::NvmeStateStore::Create(*io, options, std::move(units));
    if (!state.ok()) return state.status();
    store.state_store_ = std::move(*state);
  }
  if (placement.grad_on_nvme) {
    // Entries whose gradient stays in RAM take no space in the file.
    std::vector<size_t> on_file = entry_elements;
    for (size_t e = 0; e < on_file.size(); ++e) {
      if (grad_in_ram[e]) on_file[e] = 0;
    }
    options.file_name = tiers::kGradientFileName;
    options.alternate_regions = false;
    std::vector<bool> on_nvme(grad_in_ram.size());
    for (size_t e = 0; e < on_nvme.size(); ++e) on_nvme[e] = !grad_in_ram[e];
    absl::StatusOr<std::unique_ptr<NvmeGradients>> grads = NvmeGradients::Create(
        *io, options, EntryChunks(on_file, chunk_elements), std::move(on_nvme));
    if (!grads.ok()) return grads.status();
    store.nvme_gradients_ = std::move(*grads);
  }
  if (placement.compute_copy_on_nvme) {
    std::vector<size_t> on_file = entry_elements;
    std::vector<bool> on_nvme(copy_in_ram.size());
    for (size_t e = 0; e < on_file.size(); ++e) {
      if (copy_in_ram[e]) on_file[e] = 0;
      on_nvme[e] = !copy_in_ram[e];
    }
    absl::StatusOr<std::unique_ptr<NvmeComputeCopy>> copy = NvmeComputeCopy::Create(
        *io, options, EntryChunks(on_file, chunk_elements),
        placement.compute_copy_bf16 ? sizeof(uint16_t) : sizeof(float), std::move(on_nvme));
    if (!copy.ok()) return copy.status();
    store.nvme_compute_copy_ = std::move(*copy);
  }
  return store;
}

EntryBuffers ParameterStore::entry(int i) const {
  EntryBuffers b;
  if (!master_.empty()) b.master = master_[i].data();
  b.grad = grad_[i].data();
  if (placement_.compute_copy_bf16) {
    b.compute_bf16 = reinterpret_cast<uint16_t*>(compute_[i].data());  // null on NVMe
  }
  if (placement_.compute_copy_fp32) b.compute_fp32 = compute_[i].data();
  if (!m_.empty()) {
    b.m = m_[i].data();
    b.v = v_[i].data();
  }
  b.state_first = optimizer_state_range(i).first;
  b.elements = specs_[i].elements;
  return b;
}

size_t ParameterStore::total_elements() const {
  size_t n = 0;
  for (const auto& s : specs_) n += s.elements;
  return n;
}

absl::Status ParameterStore::ReadOptimizerState(int e, float* m, float* v) const {
  if (!has_optimizer_state(e)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "entry ", e, "'s optimizer state is another rank's ZeRO-1 shard, not in this store"));
  }
  const ElementRange range = optimizer_state_range(e);
  if (state_store_ == nullptr) {
    const size_t bytes = range.count * sizeof(float);
    std::memcpy(m, m_[e].data(), bytes);
    std::memcpy(v, v_[e].data(), bytes);
    return absl::OkStatus();
  }
  return ForEachStagedChunk(
      e, /*dirty=*/false,
      [&](const EntryChunk& c, const tiers::StagedEntry& s) {
        const size_t at = c.first - range.first;
        std::memcpy(m + at, s.array(0), c.count * sizeof(float));
        std::memcpy(v + at, s.array(1), c.count * sizeof(float));
      },
      /*state_chunks_only=*/true);
}

absl::Status ParameterStore::WriteOptimizerState(int e, const float* m, const float* v) {
  if (!has_optimizer_state(e)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "entry ", e, "'s optimizer state is another rank's ZeRO-1 shard, not in this store"));
  }
  const ElementRange range = optimizer_state_range(e);
  if (state_store_ == nullptr) {
    const size_t bytes = range.count * sizeof(float);
    std::memcpy(m_[e].data(), m, bytes);
    std::memcpy(v_[e].data(), v, bytes);
    return absl::OkStatus();
  }
  // The master streams in the same records: read, change m and v, write back.
  return ForEachStagedChunk(
      e, /*dirty=*/true,
      [&](const EntryChunk& c, const tiers::StagedEntry& s) {
        const size_t at = c.first - range.first;
        std::memcpy(s.array(0), m + at, c.count * sizeof(float));
        std::memcpy(s.array(1), v + at, c.count * sizeof(float));
      },
      /*state_chunks_only=*/true);
}

absl::Status ParameterStore::ReadMaster(int e, float* master) const {
  if (!placement_.master_on_nvme) {
    std::memcpy(master, master_[e].data(), specs_[e].elements * sizeof(float));
    return absl::OkStatus();
  }
  if (!placement_.optimizer_state_ranges.empty()) {
    // A ZeRO-1 rank's file holds its ranges only; the fp32 compute copy in RAM is every
    // master bit for bit (Create checks it is there).
    std::memcpy(master, compute_[e].data(), specs_[e].elements * sizeof(float));
    return absl::OkStatus();
  }
  return ForEachStagedChunk(
      e, /*dirty=*/false, [&](const EntryChunk& c, const tiers::StagedEntry& s) {
        std::memcpy(master + c.first, s.array(kMasterArray), c.count * sizeof(float));
      });
}

absl::Status ParameterStore::WriteMaster(int e, const float* master) {
  if (!placement_.master_on_nvme) {
    std::memcpy(master_[e].data(), master, specs_[e].elements * sizeof(float));
    return WriteComputeCopy(e, master);
  }
  // A ZeRO-1 rank's file holds its ranges only: it writes those, and the compute copy whole.
  absl::Status s = ForEachStagedChunk(
      e, /*dirty=*/true,
      [&](const EntryChunk& c, const tiers::StagedEntry& st) {
        std::memcpy(st.array(kMasterArray), master + c.first, c.count * sizeof(float));
      },
      /*state_chunks_only=*/true);
  s.Update(WriteComputeCopy(e, master));
  return s;
}

absl::Status ParameterStore::WriteMasterFromScratch(int e, const float* scratch) {
  absl::Status s = WriteMaster(e, scratch);
  float* grad = entry(e).grad;
  if (scratch == grad) std::memset(grad, 0, specs_[e].elements * sizeof(float));
  return s;
}

template <typename Fn>
absl::Status ParameterStore::ForEachStagedChunk(int e, bool dirty, Fn fn,
                                                bool state_chunks_only) const {
  for (int k = 0; k < chunks_.num_chunks(e); ++k) {
    const EntryChunk c = chunks_.chunk(e, k);
    if (state_chunks_only && !holds_state_of(c, e)) continue;
    absl::StatusOr<tiers::StagedEntry> staged = state_store_->Acquire(c.unit);
    if (!staged.ok()) return staged.status();
    fn(c, *staged);
    if (absl::Status s = state_store_->Release(c.unit, dirty); !s.ok()) return s;
  }
  return absl::OkStatus();
}

double ParameterStore::GradSumOfSquares(int e, ThreadPool* pool) const {
  if (grad_on_nvme(e)) return nvme_gradients_->SumOfSquares(e);
  return engine::GradSumOfSquares(absl::MakeConstSpan(grad_[e].data(), specs_[e].elements), pool);
}

absl::Status ParameterStore::ReadGradient(int e, float* out) const {
  if (grad_on_nvme(e)) return nvme_gradients_->Read(e, out);
  std::memcpy(out, grad_[e].data(), specs_[e].elements * sizeof(float));
  return absl::OkStatus();
}

float* ParameterStore::MasterScratch(int e) const {
  const EntryBuffers b = entry(e);
  if (b.master != nullptr) return b.master;
  if (b.compute_fp32 != nullptr) return b.compute_fp32;
  return b.grad;
}

namespace {

// The compute copy's values of `n` master values: fp32 as is, or bf16 bits.
void ConvertToComputeCopy(const float* master, size_t n, bool bf16, void* out) {
  if (!bf16) {
    std::memcpy(out, master, n * sizeof(float));
    return;
  }
  uint16_t* copy = static_cast<uint16_t*>(out);
  for (size_t j = 0; j < n; ++j) copy[j] = kernels::Float32ToBf16Bits(master[j]);
}

}  // namespace

absl::Status ParameterStore::WriteComputeCopy(int e, const float* master) {
  if (compute_.empty()) return absl::OkStatus();
  const bool bf16 = placement_.compute_copy_bf16;
  if (compute_on_nvme(e)) {
    for (int c = 0; c < nvme_compute_copy_->num_chunks(e); ++c) {
      const EntryChunk chunk = nvme_compute_copy_->chunk(e, c);
      absl::StatusOr<char*> out = nvme_compute_copy_->BeginWrite(e, c);
      if (!out.ok()) return out.status();
      ConvertToComputeCopy(master + chunk.first, chunk.count, bf16, *out);
      if (absl::Status s = nvme_compute_copy_->EndWrite(e, c); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  if (compute_[e].data() == master) return absl::OkStatus();  // assembled in place
  ConvertToComputeCopy(master, specs_[e].elements, bf16, compute_[e].data());
  return absl::OkStatus();
}

absl::Status ParameterStore::RestoreComputeCopyFromNvmeMaster(int e) {
  if ((compute_.empty() && !compute_on_nvme(e)) || !placement_.master_on_nvme) {
    return absl::OkStatus();
  }
  const bool bf16 = placement_.compute_copy_bf16;
  const size_t element_bytes = bf16 ? sizeof(uint16_t) : sizeof(float);
  for (int k = 0; k < chunks_.num_chunks(e); ++k) {
    const EntryChunk c = chunks_.chunk(e, k);
    absl::StatusOr<tiers::StagedEntry> staged = state_store_->Acquire(c.unit, /*read_ahead=*/0);
    if (!staged.ok()) return staged.status();
    const float* master = staged->array(kMasterArray);
    absl::Status s;
    if (compute_on_nvme(e)) {
      absl::StatusOr<char*> out = nvme_compute_copy_->BeginWrite(e, k);
      s = out.status();
      if (s.ok()) {
        ConvertToComputeCopy(master, c.count, bf16, *out);
        s = nvme_compute_copy_->EndWrite(e, k);
      }
    } else {
      ConvertToComputeCopy(master, c.count, bf16,
                           reinterpret_cast<char*>(compute_[e].data()) + c.first * element_bytes);
    }
    s.Update(state_store_->Release(c.unit, /*dirty=*/false));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ParameterStore::RefreshComputeCopy() {
  if (master_.empty()) return absl::OkStatus();  // on NVMe: WriteMaster kept it current
  for (size_t e = 0; e < compute_.size(); ++e) {
    if (absl::Status s = WriteComputeCopy(static_cast<int>(e), master_[e].data()); !s.ok()) {
      return s;
    }
  }
  return nvme_compute_copy_ != nullptr ? nvme_compute_copy_->Flush() : absl::OkStatus();
}

absl::Status ParameterStore::Flush() {
  absl::Status s = state_store_ == nullptr ? absl::OkStatus() : state_store_->Flush();
  if (nvme_compute_copy_ != nullptr) s.Update(nvme_compute_copy_->Flush());
  return s;
}

size_t ParameterStore::pageable_ram_bytes() const {
  size_t bytes = state_store_ != nullptr ? state_store_->staging_bytes() : 0;
  if (nvme_gradients_ != nullptr) bytes += nvme_gradients_->staging_bytes();
  if (nvme_compute_copy_ != nullptr) bytes += nvme_compute_copy_->staging_bytes();
  for (const std::vector<HostArray>* list :
       {&master_, &grad_, &m_, &v_, &alt_master_, &alt_m_, &alt_v_}) {
    for (size_t e = 0; e < list->size(); ++e) {
      const HostArray& a = (*list)[e];
      if (a.pinned.empty() && a.pageable != nullptr) bytes += a.elements * sizeof(float);
    }
  }
  if (rows_grad_.pageable != nullptr) {
    bytes += specs_[placement_.rows_gradient_entry].elements * sizeof(float);
  }
  for (size_t e = 0; e < compute_.size(); ++e) {
    if (!compute_[e].pinned.empty() || compute_[e].pageable == nullptr) continue;
    const size_t n = specs_[e].elements;
    bytes += (placement_.compute_copy_bf16 ? (n + 1) / 2 : n) * sizeof(float);
  }
  return bytes;
}

}  // namespace megatrain::engine
