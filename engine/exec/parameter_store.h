// Host home of every parameter: per layout entry one contiguous fp32 master
// buffer, AdamW m and v, and a gradient slab, each in the memory tier the
// placement gives it (pinned RAM, pageable RAM, or an NVMe file for m and v,
// and optionally the master, streamed through staging). On the CPU device the
// fp32 master is also the compute copy the weights stream from, unless the
// master is on NVMe (then a separate fp32 compute copy is kept); a GPU gets a
// separate bf16 compute copy. Compute copies are written by the optimizer in
// the same pass as the master.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/device/device.h"
#include "engine/exec/entry_chunks.h"
#include "engine/exec/nvme_compute_copy.h"
#include "engine/exec/nvme_gradients.h"
#include "engine/optimizer/host_adamw.h"
#include "engine/tiers/nvme_state_store.h"
#include "engine/tiers/placement.h"
#include "engine/tiers/uring_block_io.h"

namespace megatrain::engine {

struct EntrySpec {
  size_t elements = 0;                 // padded element count of the packed buffer
  std::vector<AdamwSegment> segments;  // tensors, with their AdamW group
};

struct EntryBuffers {
  float* master = nullptr;  // null when the master lives on NVMe (ReadMaster/WriteMaster)
  // m and v of elements [state_first, ...) of the entry (a ZeRO-1 rank's range; 0 otherwise):
  // element i's m is m[i - state_first]. Null when the optimizer state lives on NVMe, or when
  // this rank holds none of the entry's.
  float* m = nullptr;
  float* v = nullptr;
  size_t state_first = 0;
  float* grad = nullptr;     // null when the gradient lives on NVMe (NvmeGradients)
  uint16_t* compute_bf16 = nullptr;  // bf16 bits of the master; null when the master is it
  float* compute_fp32 = nullptr;     // a copy of the master (CPU device, master on NVMe)
  size_t elements = 0;
  // What fp32 weights are computed from: the fp32 compute copy, else the master.
  const float* fp32_weights() const { return compute_fp32 != nullptr ? compute_fp32 : master; }
};

// Where the store's buffers go (from tiers::PlanPlacement, or the default:
// copy endpoints pinned, everything in RAM).
struct StorePlacement {
  bool master_pinned = true;  // the copy-in source
  bool grad_pinned = true;    // the copy-out target
  // A separate bf16 compute copy (GPU devices), pinned: it is the copy-in
  // source then, and the master need not be pinned.
  bool compute_copy_bf16 = false;
  // A separate fp32 compute copy (the CPU device with the master on NVMe),
  // pinned, the copy-in source; bit for bit the master.
  bool compute_copy_fp32 = false;
  bool states_on_nvme = false;
  // The master streams with m and v (3 arrays per entry of the NVMe file).
  // Needs states_on_nvme and a compute copy (bf16 or fp32).
  bool master_on_nvme = false;
  // The fp32 gradients in an NVMe file too (written by backward's copy-out,
  // read back by the optimizer), but for grad_ram_entries, kept in RAM
  // (grad_pinned says which kind): the embedding, whose gradient is a
  // scatter-add of rows on the host, and the entries the placement keeps in
  // the RAM left over (tiers::Placement::grad_ram_entries).
  bool grad_on_nvme = false;
  std::vector<int> grad_ram_entries;
  // The compute copy (bf16 or fp32, which must be enabled) in an NVMe file
  // too: written by the optimizer, read by the executor's weight copies in
  // step order; but for compute_copy_ram_entries (the embedding, gathered by
  // rows on the host).
  bool compute_copy_on_nvme = false;
  std::vector<int> compute_copy_ram_entries;
  bool compute_copy_pinned = true;  // the RAM compute copies: pinned, else pageable
  // NVMe traffic and the host optimizer work in chunks of this many bytes per
  // array, so staging is a few chunks whatever the largest entry. A positive
  // multiple of 256 KiB (the gradient norm's 64 Ki-element chunk). Results
  // never depend on it.
  size_t nvme_chunk_bytes = kDefaultNvmeChunkBytes;
  static constexpr size_t kDefaultNvmeChunkBytes = tiers::kDefaultNvmeChunkBytes;
  std::string nvme_dir;  // with states_on_nvme or grad_on_nvme
  // ZeRO-1 (docs/scale_out.md, Zero1Shards): when not empty, one range per entry, and m and v
  // are allocated only for those elements (the ones this rank owns and updates), each range whole
  // chunks (EntryChunks) of its entry, maybe none. ReadOptimizerState / WriteOptimizerState move
  // the range's, and refuse an entry with an empty one. With states_on_nvme the state file holds
  // the ranges' chunks only, and with master_on_nvme the masters' too (the fp32 compute copy in
  // RAM then holds every weight; Create refuses a bf16 copy or one on NVMe).
  std::vector<ElementRange> optimizer_state_ranges;
  // Data parallelism over MPI with a tied embedding (docs/scale_out.md): this entry (the
  // embedding, also the LM head) gets a second gradient array of its size, where the executor
  // scatters the rows' gradient apart from the LM head's, so the ranks' reduction can add the two
  // in one process's order. Pinned like the gradients (grad_pinned); the entry's gradient must be
  // in RAM. -1 = none.
  int rows_gradient_entry = -1;
  int read_ahead = 2;    // entries of m/v (and master) read ahead of the one being updated
  int max_writes_in_flight = 2;
  size_t nvme_request_bytes = tiers::kDefaultBlockBytes;  // I/O request size of the NVMe file
  // The state file gets alternate regions (NvmeStateStoreOptions::alternate_regions) for the
  // trainer's speculative update; with states_on_nvme only.
  bool alternate_state_regions = false;
  // Alternate master, m and v arrays per entry in RAM, each in its current array's tier (pinned
  // or pageable), for the trainer's speculative update of a state in RAM: it writes them out of
  // place, and committing makes them current by swapping pointers (SwapAlternateState). Needs
  // the master in RAM (not master_on_nvme) and every entry's m and v (no ZeRO-1). With
  // states_on_nvme (the mixed form: m and v on NVMe) only the master gets an alternate array,
  // and alternate_state_regions must give m and v theirs in the state file.
  bool alternate_ram_state = false;
  // The block I/O of the NVMe tier; null = the store's own io_uring. Tests
  // pass a fault-injecting one. Not owned; must outlive the store.
  tiers::BlockIo* block_io = nullptr;
};

class ParameterStore {
 public:
  // Every buffer zero-initialised (an NVMe state file is created zeroed).
  static absl::StatusOr<ParameterStore> Create(Device& device, std::vector<EntrySpec> entries,
                                               const StorePlacement& placement = {});

  ParameterStore(ParameterStore&&) = default;
  ParameterStore& operator=(ParameterStore&&) = default;

  int num_entries() const { return static_cast<int>(specs_.size()); }
  const EntrySpec& spec(int entry) const { return specs_[entry]; }
  EntryBuffers entry(int entry) const;
  size_t total_elements() const;
  const StorePlacement& placement() const { return placement_; }

  // The NVMe-resident optimizer state, or null when m and v are in RAM. Used
  // from one thread at a time (the optimizer pass, or a checkpoint). Arrays
  // of a staged entry: 0 = m, 1 = v, and kMasterArray = the master when
  // master_on_nvme().
  tiers::NvmeStateStore* state_store() const { return state_store_.get(); }
  static constexpr int kMasterArray = 2;
  bool master_on_nvme() const { return placement_.master_on_nvme; }
  // How entries are cut into the chunks the NVMe state file and the optimizer
  // pass work in: state_store() unit chunks().chunk(e, c).unit.
  const EntryChunks& chunks() const { return chunks_; }

  // The NVMe-resident gradients, or null when every gradient is in RAM.
  NvmeGradients* nvme_gradients() const { return nvme_gradients_.get(); }
  bool grad_on_nvme(int entry) const {
    return nvme_gradients_ != nullptr && nvme_gradients_->on_nvme(entry);
  }
  // The NVMe-resident compute copy, or null when every compute copy is in RAM.
  NvmeComputeCopy* nvme_compute_copy() const { return nvme_compute_copy_.get(); }
  bool compute_on_nvme(int entry) const {
    return nvme_compute_copy_ != nullptr && nvme_compute_copy_->on_nvme(entry);
  }
  // Sum of squares of the entry's accumulated gradient wherever it lives
  // (grad_norm.h's scheme, the same bits).
  double GradSumOfSquares(int entry, ThreadPool* pool) const;
  // The entry's gradient wherever it lives; not during a step.
  absl::Status ReadGradient(int entry, float* out) const;

  // The embedding rows' gradient kept apart from entry e's slab (StorePlacement::
  // rows_gradient_entry), or null for every other entry and without one.
  float* rows_gradient(int entry) const {
    return entry == placement_.rows_gradient_entry ? rows_grad_.data() : nullptr;
  }

  // The elements of entry e whose m and v this store holds: the whole entry, or a ZeRO-1 rank's
  // range (StorePlacement::optimizer_state_ranges; count 0 when another rank owns all of it).
  ElementRange optimizer_state_range(int entry) const {
    return placement_.optimizer_state_ranges.empty() ? ElementRange{0, specs_[entry].elements}
                                                     : placement_.optimizer_state_ranges[entry];
  }
  bool has_optimizer_state(int entry) const { return optimizer_state_range(entry).count > 0; }
  // Whether chunk c (of entry e) lies in the entry's optimizer_state_range: ranges are whole
  // chunks, so a chunk is in or out.
  bool holds_state_of(const EntryChunk& c, int entry) const {
    const ElementRange range = optimizer_state_range(entry);
    return c.first >= range.first && c.first < range.end();
  }
  // Whether this store holds m and v of the whole entry.
  bool has_whole_optimizer_state(int entry) const {
    return optimizer_state_range(entry).count == specs_[entry].elements;
  }
  // m and v of the entry's optimizer_state_range (range.count floats each) wherever they live;
  // not during an optimizer pass. FAILED_PRECONDITION for an entry without optimizer state here
  // (has_optimizer_state).
  absl::Status ReadOptimizerState(int entry, float* m, float* v) const;
  absl::Status WriteOptimizerState(int entry, const float* m, const float* v);
  // The fp32 master of one entry wherever it lives (entry's elements floats);
  // not during an optimizer pass. WriteMaster also rewrites the entry's
  // compute copy, so after it nothing needs RefreshComputeCopy.
  absl::Status ReadMaster(int entry, float* master) const;
  absl::Status WriteMaster(int entry, const float* master);
  // A RAM buffer of entry e's size where a master may be assembled before
  // WriteMaster(e, it) (init, Hugging Face and checkpoint loads): the master
  // itself when in RAM, else the fp32 compute copy (WriteMaster rewrites it
  // with the same values), else the gradient slab (free between steps), else
  // null (a bf16 copy and the gradient on NVMe: the caller brings its own
  // buffer).
  float* MasterScratch(int entry) const;
  // WriteMaster with the master on NVMe, from a MasterScratch or the caller's
  // buffer; a gradient slab used as scratch is zeroed after, so ReadGradient
  // sees what it would with the master in RAM.
  absl::Status WriteMasterFromScratch(int entry, const float* scratch);
  // Rewrites the compute copy of every entry from its RAM master (after the
  // masters were written in place, outside the optimizer); nothing without a
  // compute copy or with the master on NVMe (WriteMaster keeps that current).
  absl::Status RefreshComputeCopy();
  // Rewrites entry e's compute copy from its current master on NVMe (chunk by chunk): what a
  // discarded speculative update (engine/train/speculative_update.h), which wrote the copy, is
  // undone with when no update pass follows. OK at once without a compute copy.
  absl::Status RestoreComputeCopyFromNvmeMaster(int entry);

  // The speculative update of a state in RAM (StorePlacement::alternate_ram_state,
  // parameter_store_alternates.cc). alternate(e): entry e's alternate master, m and v (the other
  // fields null; all null without alternates; m and v null in the mixed form, where they are
  // on NVMe). SwapAlternateState(e): the alternates become the current master, m and v (the
  // master alone in the mixed form) and the current ones the alternates; pointers only, nothing
  // copied.
  // Not while anything reads entry e's master, m or v (a weight copy, a checkpoint, an update).
  bool has_alternate_ram_state() const { return !alt_master_.empty(); }
  EntryBuffers alternate(int entry) const;
  void SwapAlternateState(int entry);
  // Rewrites entry e's compute copy from its RAM master: what a discarded speculative update
  // of a state in RAM, which wrote the copy in place, is undone with. OK at once without a
  // compute copy (on the CPU device the master is what the weights stream from).
  absl::Status RestoreComputeCopyFromRamMaster(int entry);

  // Waits for NVMe write-backs (and syncs the file); OK at once in RAM.
  absl::Status Flush();

  // Pageable host RAM this store holds (NVMe staging included); the pinned
  // part is counted by the device's pinned budget.
  size_t pageable_ram_bytes() const;

 private:
  struct FreeDeleter {
    void operator()(float* p) const;
  };
  // One host buffer: pinned (from the device's budget) or pageable.
  struct HostArray {
    PinnedHostBuffer pinned;
    std::unique_ptr<float, FreeDeleter> pageable;
    size_t elements = 0;  // allocated (a ZeRO-1 range's m and v: fewer than the entry's)
    float* data() const { return pinned.empty() ? pageable.get() : pinned.data_as<float>(); }
  };
  ParameterStore() = default;
  static absl::StatusOr<HostArray> AllocateArray(Device& device, size_t elements, bool pinned);
  // Acquires each chunk of entry e from the state file (only those of its optimizer_state_range
  // with state_chunks_only), calls fn(chunk, staged), releases it (written back when dirty).
  template <typename Fn>
  absl::Status ForEachStagedChunk(int e, bool dirty, Fn fn, bool state_chunks_only = false) const;
  // Allocates alt_master_, alt_m_, alt_v_ (StorePlacement::alternate_ram_state).
  absl::Status AllocateAlternates(Device& device);
  // Writes the compute copy of one entry (if any) from `master`, its new values.
  absl::Status WriteComputeCopy(int entry, const float* master);

  std::vector<EntrySpec> specs_;
  StorePlacement placement_;
  std::vector<HostArray> master_, grad_, m_, v_;
  std::vector<HostArray> alt_master_, alt_m_, alt_v_;  // alternate_ram_state only
  std::vector<HostArray> compute_;  // bf16 pairs in float-sized storage, or fp32, when enabled
  HostArray rows_grad_;             // rows_gradient(placement_.rows_gradient_entry)
  std::unique_ptr<tiers::UringBlockIo> io_;
  std::unique_ptr<tiers::NvmeStateStore> state_store_;
  EntryChunks chunks_;
  std::unique_ptr<NvmeGradients> nvme_gradients_;
  std::unique_ptr<NvmeComputeCopy> nvme_compute_copy_;
};

}  // namespace megatrain::engine
