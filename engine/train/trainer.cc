// Trainer implementation.
#include "engine/train/trainer.h"

#include <cblas.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"
#include "engine/common/host_cores.h"
#include "engine/model/hf_loader.h"
#include "engine/optimizer/grad_norm.h"
#include "engine/train/data_parallel_step.h"
#include "engine/exec/executor_geometry.h"
#include "kernels/common/adamw.h"

namespace megatrain::engine {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// splitmix64: a tiny, fully specified generator, so initial weights are the
// same on every platform and library version.
uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double Uniform01(uint64_t& state) {
  return (static_cast<double>(SplitMix(state) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

bool IsNorm(TensorRole role) {
  return role == TensorRole::kInputNorm || role == TensorRole::kPostAttentionNorm ||
         role == TensorRole::kQNorm || role == TensorRole::kKNorm ||
         role == TensorRole::kFinalNorm;
}

}  // namespace

double LayerTiming::overlap_ratio() const {
  if (copy_in_seconds <= 0) return 1.0;
  return std::max(0.0, 1.0 - stall_seconds / copy_in_seconds);
}

Trainer::Trainer(Device& device, ModelConfig config, ParameterLayout layout, ParameterStore store,
                 const TrainerOptions& options, kernels::cpu::RopeTable rope)
    : device_(device),
      config_(std::move(config)),
      layout_(std::move(layout)),
      store_(std::move(store)),
      options_(options),
      rope_(std::move(rope)),
      gate_(layout_.num_entries()),
      optimizer_pool_(static_cast<size_t>(ThreadCountOrCores(options.optimizer_threads))),
      compute_pool_(static_cast<size_t>(std::max(1, options.blas_threads))),
      adamw_(&optimizer_pool_),
      turns_(layout_.num_entries()),
      update_seconds_(layout_.num_entries(), 0.0) {}

Trainer::~Trainer() { WaitForUpdates(); }

void Trainer::InitializeRandom(uint64_t seed) {
  WaitForUpdates();
  for (const DeviceLane& lane : Lanes()) lane.executor->InvalidateWeights();
  bool every_entry_has_scratch = true;
  for (int e = 0; e < store_.num_entries(); ++e) {
    every_entry_has_scratch = every_entry_has_scratch && store_.MasterScratch(e) != nullptr;
  }
  if (every_entry_has_scratch) {
    const std::vector<float*> masters = MasterDestinations();
    for (int e = 0; e < layout_.num_entries(); ++e) FillRandomEntry(seed, e, masters[e]);
    init_status_ = WriteMasters();
    return;
  }
  // Some entry has no RAM array of its size (every array on NVMe): one entry
  // at a time through a scratch buffer, so initialisation never holds a copy
  // of the model in RAM.
  init_status_ = absl::OkStatus();
  for (int e = 0; e < layout_.num_entries() && init_status_.ok(); ++e) {
    std::vector<float> scratch;
    float* master = store_.MasterScratch(e);
    if (master == nullptr) {
      scratch.resize(store_.spec(e).elements);
      master = scratch.data();
    }
    FillRandomEntry(seed, e, master);
    init_status_ = store_.WriteMasterFromScratch(e, master);
  }
  if (init_status_.ok()) init_status_ = store_.Flush();
}

void Trainer::FillRandomEntry(uint64_t seed, int e, float* master) {
  // Weight matrices are drawn in chunks, each from its own generator seeded by
  // (seed, entry, tensor, chunk), so the values do not depend on how many
  // threads fill them, nor on the order entries are filled in.
  constexpr size_t kChunk = 64 * 1024;
  struct Piece {
    float* p;
    size_t n;
    uint64_t state;
  };
  std::vector<Piece> pieces;
  std::memset(master, 0, store_.spec(e).elements * sizeof(float));
  const auto& tensors = layout_.entries()[e].tensors;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const TensorSlot& slot = tensors[t];
    float* p = master + slot.offset;
    const size_t n = slot.num_elements();
    if (IsNorm(slot.role)) {
      std::fill(p, p + n, 1.0f);
    } else if (slot.weight_decay) {
      for (size_t first = 0; first < n; first += kChunk) {
        uint64_t state = seed ^ (static_cast<uint64_t>(e) << 40) ^
                         (static_cast<uint64_t>(t) << 28) ^ (first / kChunk);
        SplitMix(state);  // decorrelate neighbouring seeds
        pieces.push_back({p + first, std::min(kChunk, n - first), state});
      }
    }  // biases stay zero
  }
  compute_pool_.ParallelFor(pieces.size(), [&pieces](size_t i) {
    Piece piece = pieces[i];
    for (size_t j = 0; j < piece.n; ++j) {
      // Box-Muller in double.
      const double u1 = Uniform01(piece.state);
      const double u2 = Uniform01(piece.state);
      const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
      piece.p[j] = static_cast<float>(0.02 * z);
    }
  });
}

std::vector<float*> Trainer::MasterDestinations() {
  std::vector<float*> out;
  for (int e = 0; e < store_.num_entries(); ++e) out.push_back(store_.MasterScratch(e));
  master_destinations_ = out;
  return out;
}

absl::Status Trainer::WriteMasters() {
  if (!store_.master_on_nvme()) return store_.RefreshComputeCopy();
  const std::vector<float*> masters = master_destinations_;
  absl::Status status;
  for (int e = 0; e < store_.num_entries() && status.ok(); ++e) {
    status = store_.WriteMasterFromScratch(e, masters[e]);
  }
  if (status.ok()) status = store_.Flush();
  return status;
}

absl::Status Trainer::LoadHfWeights(const std::string& dir, const InputFiles* inputs) {
  WaitForUpdates();
  for (const DeviceLane& lane : Lanes()) lane.executor->InvalidateWeights();
  std::vector<int> without_scratch;
  for (int e = 0; e < store_.num_entries(); ++e) {
    if (store_.MasterScratch(e) == nullptr) without_scratch.push_back(e);
  }
  if (without_scratch.empty()) {
    absl::Status loaded = engine::LoadHfWeights(dir, layout_, MasterDestinations(), inputs);
    absl::Status written = WriteMasters();
    return loaded.ok() ? written : loaded;
  }
  // Every array of some entries is on NVMe: the entries with a RAM array of
  // their size first, in one pass, then the others one at a time through one
  // buffer of the largest, so loading never holds a copy of the model in RAM.
  std::vector<float*> destinations(static_cast<size_t>(store_.num_entries()), nullptr);
  for (int e = 0; e < store_.num_entries(); ++e) destinations[e] = store_.MasterScratch(e);
  if (absl::Status s = engine::LoadHfWeights(dir, layout_, destinations, inputs); !s.ok()) return s;
  for (int e = 0; e < store_.num_entries(); ++e) {
    if (destinations[e] == nullptr) continue;
    if (absl::Status s = store_.WriteMasterFromScratch(e, destinations[e]); !s.ok()) return s;
  }
  size_t largest = 0;
  for (int e : without_scratch) largest = std::max(largest, store_.spec(e).elements);
  std::vector<float> scratch(largest);
  for (int e : without_scratch) {
    std::vector<float*> one(destinations.size(), nullptr);
    one[e] = scratch.data();
    if (absl::Status s = engine::LoadHfWeights(dir, layout_, one, inputs); !s.ok()) return s;
    if (absl::Status s = store_.WriteMaster(e, scratch.data()); !s.ok()) return s;
  }
  return store_.Flush();
}

TrainerProgress Trainer::progress() const {
  // The previous norm only where a rule reads it: the exact rule's checkpoints stay as before.
  return TrainerProgress{
      step_, applied_updates_, skipped_steps_, consecutive_skips_,
      options_.grad_clip_rule == GradClipRule::kPreviousNorm ? previous_grad_norm_ : 0.0};
}

void Trainer::RestoreProgress(const TrainerProgress& p) {
  WaitForUpdates();
  step_ = p.step;
  applied_updates_ = p.applied_updates;
  skipped_steps_ = p.skipped_steps;
  consecutive_skips_ = p.consecutive_skips;
  previous_grad_norm_ = p.previous_grad_norm;
  gate_.ResetAll(step_);
  // The masters were just loaded whole: an earlier failure to write the initial ones is moot.
  // A failure here shows at the next Step.
  init_status_ = store_.RefreshComputeCopy();
  for (const DeviceLane& lane : Lanes()) lane.executor->InvalidateWeights();
}

void Trainer::BeginSnapshot() {
  WaitForUpdates();
  absl::MutexLock lock(&snapshot_mu_);
  snapshot_active_ = true;
  snapshot_done_.assign(static_cast<size_t>(store_.num_entries()), false);
}

void Trainer::SnapshotEntryDone(int entry) {
  absl::MutexLock lock(&snapshot_mu_);
  if (snapshot_active_) snapshot_done_[entry] = true;
}

void Trainer::EndSnapshot() {
  absl::MutexLock lock(&snapshot_mu_);
  snapshot_active_ = false;
}

void Trainer::WaitForUpdates() {
  if (update_thread_.joinable()) update_thread_.join();
}

absl::Status Trainer::PreviousUpdateFailure() const {
  return absl::Status(update_status_.code(), absl::StrCat("optimizer update of step ", step_,
                                                          " failed: ", update_status_.message()));
}

absl::Status Trainer::UpdateStatus() {
  WaitForUpdates();
  return update_status_.ok() ? init_status_ : update_status_;
}

void Trainer::LaunchUpdate(uint64_t version, double clip_coefficient, double lr,
                           std::vector<bool> committed) {
  ++applied_updates_;
  const auto decay = kernels::MakeAdamwStepScalars(
      lr, options_.beta1, options_.beta2, options_.eps, options_.weight_decay,
      static_cast<long long>(applied_updates_), clip_coefficient);
  const auto no_decay =
      kernels::MakeAdamwStepScalars(lr, options_.beta1, options_.beta2, options_.eps, 0.0,
                                    static_cast<long long>(applied_updates_), clip_coefficient);
  // Entries in forward order: the next step's forward needs the embedding and
  // layer 0 first, so it can start while later layers are still updated.
  update_thread_ = std::thread([this, version, decay, no_decay,
                                committed = std::move(committed)] {
    for (int e = 0; e < store_.num_entries(); ++e) {
      {
        // A checkpoint being written still reads this entry: wait for it.
        absl::MutexLock lock(&snapshot_mu_);
        auto written = [this, e]() ABSL_SHARED_LOCKS_REQUIRED(snapshot_mu_) {
          return !snapshot_active_ || snapshot_done_[e];
        };
        snapshot_mu_.Await(absl::Condition(&written));
      }
      const auto t0 = std::chrono::steady_clock::now();
      // ZeRO-1: only the owners update (each its range); the others get the masters by broadcast.
      const bool mine = store_.has_optimizer_state(e);
      if (update_status_.ok() && !committed.empty() && committed[e]) {
        CommitSpeculated(e);  // updated during the backward with this very coefficient
      } else if (update_status_.ok() && mine) {
        update_status_ = UpdateEntry(e, decay, no_decay);
      }
      update_seconds_[e] = SecondsSince(t0);
      // Published even after a failure so no weight copy waits forever; the
      // next Step reports the failure and discards its results.
      gate_.Publish(e, version);
    }
  });
}

absl::Status Trainer::UpdateEntry(int e, const kernels::AdamwStepScalars& decay,
                                  const kernels::AdamwStepScalars& no_decay, bool speculative) {
  const EntryBuffers b = store_.entry(e);
  tiers::NvmeStateStore* states = store_.state_store();
  NvmeGradients* grads = store_.grad_on_nvme(e) ? store_.nvme_gradients() : nullptr;
  NvmeComputeCopy* copy = store_.compute_on_nvme(e) ? store_.nvme_compute_copy() : nullptr;
  // A speculative update of a state in RAM writes the alternates, out of place (the current
  // master, m and v stay as they are until the commit swaps them in).
  const EntryBuffers alternate = speculative ? store_.alternate(e) : EntryBuffers{};
  if (states == nullptr && grads == nullptr && copy == nullptr &&
      store_.has_whole_optimizer_state(e)) {
    const AdamwArrays arrays = UpdateTargets(b.master, b.m, b.v, alternate, 0);
    adamw_.StepTo(decay, no_decay, store_.spec(e).segments, arrays, b.grad, b.compute_bf16);
    if (b.compute_fp32 != nullptr) {
      std::memcpy(b.compute_fp32, arrays.param_out, b.elements * sizeof(float));
    }
    return absl::OkStatus();
  }
  // Chunk by chunk (ParameterStore::chunks): each chunk's m, v (and master)
  // are read ahead of its update while earlier chunks are written back. A ZeRO-1 rank updates
  // the chunks of its range only.
  const EntryChunks& chunks = store_.chunks();
  for (int c = 0; c < chunks.num_chunks(e); ++c) {
    const EntryChunk chunk = chunks.chunk(e, c);
    if (!store_.holds_state_of(chunk, e)) continue;
    float* master = b.master != nullptr ? b.master + chunk.first : nullptr;
    float* m = b.m != nullptr ? b.m + (chunk.first - b.state_first) : nullptr;
    float* v = b.v != nullptr ? b.v + (chunk.first - b.state_first) : nullptr;
    if (states != nullptr) {
      // A speculative update follows the backward, not the unit order: it reads ahead within
      // the entry only.
      absl::StatusOr<tiers::StagedEntry> staged =
          speculative ? states->Acquire(chunk.unit, /*read_ahead=*/0) : states->Acquire(chunk.unit);
      if (!staged.ok()) return staged.status();
      if (speculative && c + 1 < chunks.num_chunks(e)) {
        if (absl::Status s = states->Prefetch(chunk.unit + 1); !s.ok()) return s;
      }
      m = staged->array(0);
      v = staged->array(1);
      if (store_.master_on_nvme()) master = staged->array(ParameterStore::kMasterArray);
    }
    const float* grad = b.grad != nullptr ? b.grad + chunk.first : nullptr;
    if (grads != nullptr) {
      absl::StatusOr<const float*> staged = grads->AcquireForUpdate(e, c, speculative);
      if (!staged.ok()) return staged.status();
      grad = *staged;
    }
    const std::vector<AdamwSegment> segments =
        SegmentsInRange(store_.spec(e).segments, chunk.first, chunk.count);
    // The compute copy's chunk: in RAM, or staged for NVMe (the same chunking).
    uint16_t* copy_bf16 = b.compute_bf16 != nullptr ? b.compute_bf16 + chunk.first : nullptr;
    float* copy_fp32 = b.compute_fp32 != nullptr ? b.compute_fp32 + chunk.first : nullptr;
    if (copy != nullptr) {
      absl::StatusOr<char*> staged = copy->BeginWrite(e, c);
      if (!staged.ok()) return staged.status();
      if (copy->element_bytes() == sizeof(uint16_t)) {
        copy_bf16 = reinterpret_cast<uint16_t*>(*staged);
      } else {
        copy_fp32 = reinterpret_cast<float*>(*staged);
      }
    }
    const AdamwArrays arrays = UpdateTargets(master, m, v, alternate, chunk.first);
    adamw_.StepTo(decay, no_decay, segments, arrays, grad, copy_bf16);
    // The fp32 compute copy is the master bit for bit: copied, not recomputed.
    if (copy_fp32 != nullptr) {
      std::memcpy(copy_fp32, arrays.param_out, chunk.count * sizeof(float));
    }
    if (copy != nullptr) {
      if (absl::Status s = copy->EndWrite(e, c); !s.ok()) return s;
    }
    if (grads != nullptr) {
      if (absl::Status s = grads->ReleaseAfterUpdate(e, c); !s.ok()) return s;
    }
    if (states != nullptr) {
      absl::Status s =
          speculative ? states->ReleaseToAlternate(chunk.unit) : states->Release(chunk.unit);
      if (!s.ok()) return s;
    }
  }
  // The backward reaches the entry below next: its state can stream in meanwhile.
  if (speculative && states != nullptr && e > 0) {
    if (absl::Status s = states->Prefetch(chunks.chunk(e - 1, 0).unit); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> Trainer::ReadSlab(const std::string& hf_name, bool gradient) {
  WaitForUpdates();
  absl::StatusOr<TensorLocation> loc = layout_.Find(hf_name);
  if (!loc.ok()) return loc.status();
  const EntryBuffers b = store_.entry(loc->entry);
  std::vector<float> staged;
  const float* base = gradient ? b.grad : b.master;
  if (base == nullptr) {
    staged.resize(b.elements);
    absl::Status read = gradient ? store_.ReadGradient(loc->entry, staged.data())
                                 : store_.ReadMaster(loc->entry, staged.data());
    if (!read.ok()) return read;
    base = staged.data();
  }
  const float* p = base + loc->slot->offset;
  return std::vector<float>(p, p + loc->slot->num_elements());
}

absl::StatusOr<std::vector<float>> Trainer::ReadTensor(const std::string& hf_name) {
  return ReadSlab(hf_name, false);
}

absl::StatusOr<std::vector<float>> Trainer::ReadGradient(const std::string& hf_name) {
  return ReadSlab(hf_name, true);
}

absl::StatusOr<double> Trainer::Evaluate(const std::vector<const int32_t*>& inputs,
                                         const std::vector<const int32_t*>& targets,
                                         const std::vector<TokenLayout>& layouts) {
  if (inputs.size() != targets.size()) {
    return absl::InvalidArgumentError("evaluation needs as many target as input micro-batches");
  }
  if (!layouts.empty() && layouts.size() != inputs.size()) {
    return absl::InvalidArgumentError("evaluation needs as many token layouts as micro-batches");
  }
  double loss_sum = 0;
  int64_t valid = 0;
  for (size_t mb = 0; mb < inputs.size(); ++mb) {
    absl::StatusOr<MicroBatchResult> r =
        executor_->EvaluateMicroBatch(inputs[mb], targets[mb], step_,
                                      layouts.empty() ? TokenLayout{} : layouts[mb]);
    if (!r.ok()) return r.status();
    loss_sum += r->loss_sum;
    valid += r->valid_tokens;
  }
  if (valid == 0) return absl::InvalidArgumentError("evaluation batch has no valid targets");
  return loss_sum / static_cast<double>(valid);
}

absl::StatusOr<std::vector<float>> Trainer::Logits(const int32_t* inputs) {
  return executor_->ComputeLogits(inputs, step_);
}

std::vector<DeviceLane> Trainer::Lanes() const {
  std::vector<DeviceLane> lanes = {{devices_[0], executor_.get()}};
  for (size_t d = 1; d < devices_.size(); ++d) {
    lanes.push_back({devices_[d], lane_executors_[d - 1].get()});
  }
  return lanes;
}

absl::StatusOr<StepReport> Trainer::EmptyStep(int64_t tokens) {
  // Nothing counts (SFT rows whose assistant parts were all truncated away, say): the mean loss
  // has no terms, so there is no gradient to follow. Running AdamW on zero gradients would
  // still move the weights (momentum, decay), so the step only advances the count, as a step
  // skipped for a non-finite norm does, without counting as one.
  WaitForUpdates();
  if (!update_status_.ok()) {
    return absl::Status(update_status_.code(), absl::StrCat("optimizer update of step ", step_,
                                                            " failed: ", update_status_.message()));
  }
  StepReport report;
  report.step = step_ + 1;
  report.tokens = tokens;
  report.no_counted_targets = true;
  report.learning_rate = LearningRateAt(options_.lr, step_ + 1);
  ++step_;
  gate_.ResetAll(step_);  // parameters unchanged, but this step's version is final
  report.skipped_total = skipped_steps_;
  return report;
}

absl::StatusOr<StepReport> Trainer::Step(const std::vector<const int32_t*>& inputs,
                                         const std::vector<const int32_t*>& targets,
                                         const std::vector<TokenLayout>& layouts) {
  if (inputs.empty() || inputs.size() != targets.size() ||
      (!layouts.empty() && layouts.size() != inputs.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("step needs matching micro-batches: ", inputs.size(), " inputs, ",
                     targets.size(), " targets, ", layouts.size(), " token layouts"));
  }
  if (!ranks_out_of_step_.ok()) return ranks_out_of_step_;
  const int64_t n = dims_.tokens();
  int64_t total_valid = 0;
  for (const int32_t* t : targets) {
    for (int64_t i = 0; i < n; ++i) total_valid += t[i] >= 0 ? 1 : 0;
  }
  dist::Communicator* comm = options_.communicator;
  const dist::CommunicatorStats comm_before =
      comm != nullptr ? comm->stats() : dist::CommunicatorStats{};
  if (comm != nullptr) {
    absl::StatusOr<int64_t> global = GlobalValidTargets(*comm, total_valid);
    if (!global.ok()) return global.status();
    total_valid = *global;
  }
  if (total_valid == 0) return EmptyStep(n * static_cast<int64_t>(inputs.size()));
  const float inv_total_valid = static_cast<float>(1.0 / static_cast<double>(total_valid));
  const uint64_t weights_version = step_;
  if (!init_status_.ok()) {
    return absl::Status(init_status_.code(), absl::StrCat("writing the initial master weights "
                                                          "failed: ",
                                                          init_status_.message()));
  }

  const std::vector<DeviceLane> lanes = Lanes();
  std::vector<double> link_bytes_before;
  for (const DeviceLane& lane : lanes) {
    if (options_.collect_timeline) {
      lane.device->timeline().Clear();
      lane.device->timeline().set_enabled(true);
    }
    lane.device->ResetPeak();
    link_bytes_before.push_back(lane.executor->layer_link_bytes());
  }
  // The activation modes this step runs with (re-decided after it).
  std::vector<ActivationBlockReport> activation_blocks;
  for (const BlockDecision& b : executor_->activation_decision().blocks) {
    activation_blocks.push_back(
        {b.first_layer, b.num_layers, ActivationModeName(b.mode), b.reason});
  }
  const auto t0 = std::chrono::steady_clock::now();
  // Speculative update: the last micro-batch's final gradients feed it (trainer_speculation.cc).
  // With several devices the last micro-batch's copy-outs take the last turns, so an entry is
  // final there once every earlier micro-batch's contribution has landed.
  const bool speculate = speculation_ != nullptr && comm == nullptr;
  // The previous-norm clip rule's coefficient, planned before any gradient exists (0: none).
  const double planned_clip =
      PlannedClipCoefficient(options_.grad_clip_rule, options_.grad_clip,
                             options_.grad_clip_headroom, previous_grad_norm_);
  if (speculate) BeginSpeculation(weights_version, planned_clip);
  MicroBatchStepArgs step_args;
  step_args.inv_total_valid = inv_total_valid;
  step_args.weights_version = weights_version;
  step_args.reduction = device_reduction_.get();
  step_args.reduce_every_micro_batch = executor_->reduces_every_micro_batch();
  if (speculate) step_args.on_last_gradient_final = [this](int e) { speculation_->EntryFinal(e); };
  absl::StatusOr<MicroBatchesResult> ran =
      RunMicroBatchesOnLanes(lanes, turns_, inputs, targets, layouts, step_args);
  if (!ran.ok()) {
    if (reduce_scatter_across_ranks_) {
      // The other ranks may wait in a reduce-scatter this rank never joined: no later collective
      // of this trainer can meet theirs.
      ranks_out_of_step_ = absl::FailedPreconditionError(absl::StrCat(
          "a failed step (", ran.status().message(),
          ") left this rank's reduce-scatters out of step with the other ranks'; the job must "
          "end (train_local aborts every rank) and resume from its last checkpoint"));
    }
    const SpeculativeUpdate::Outcome dropped =
        speculate ? speculation_->Finish() : SpeculativeUpdate::Outcome{};
    WaitForUpdates();
    (void)DiscardSpeculation(dropped);  // the step's error is what the caller needs
    // Unless the previous step's pass failed first: its failure is the cause (this step's
    // forward may only have met the store it left).
    if (!update_status_.ok()) return PreviousUpdateFailure();
    return ran.status();
  }
  double loss_sum = ran->loss_sum;
  const SpeculativeUpdate::Outcome speculation =
      speculate ? speculation_->Finish() : SpeculativeUpdate::Outcome{};
  if (!speculation.status.ok()) {
    WaitForUpdates();
    (void)DiscardSpeculation(speculation);  // the speculation's own error is reported
    if (!update_status_.ok()) return PreviousUpdateFailure();
    return absl::Status(speculation.status.code(),
                        absl::StrCat("speculative optimizer update of step ", step_ + 1,
                                     " failed: ", speculation.status.message()));
  }
  const double step_seconds = SecondsSince(t0);
  const auto wait_t0 = std::chrono::steady_clock::now();
  WaitForUpdates();
  if (!update_status_.ok()) return PreviousUpdateFailure();
  if (comm != nullptr) {
    absl::StatusOr<double> global = GlobalLossSum(*comm, loss_sum);
    if (!global.ok()) return global.status();
    loss_sum = *global;
    absl::Status reduced = absl::OkStatus();
    if (reduce_scatter_across_ranks_) {
      std::vector<bool> shards(static_cast<size_t>(store_.num_entries()));
      for (int e = 0; e < store_.num_entries(); ++e) shards[e] = executor_->reduces_entry(e);
      reduced = GatherReducedGradients(*comm, store_, shards);
    } else if (zero1_shards_.world() == 0) {
      reduced = ReduceGradientsInRankOrder(*comm, store_);
    } else {
      reduced = ReduceGradientsToOwners(*comm, store_, zero1_shards_);
    }
    if (!reduced.ok()) return reduced;
  }
  // The update thread of this step will write these again: keep the last ones.
  const std::vector<double> previous_update_seconds = update_seconds_;

  StepReport report;
  report.previous_update_wait_seconds = SecondsSince(wait_t0);
  report.step = step_ + 1;
  report.loss = loss_sum / static_cast<double>(total_valid);
  report.valid_tokens = total_valid;
  report.tokens = n * static_cast<int64_t>(inputs.size());
  if (comm != nullptr) {
    report.communication_seconds = comm->stats().seconds - comm_before.seconds;
    report.communication_bytes = comm->stats().bytes_sent - comm_before.bytes_sent;
  }
  report.step_seconds = step_seconds;
  report.tokens_per_second = static_cast<double>(report.tokens) / std::max(step_seconds, 1e-9);
  report.device_arena_peak_bytes = device_.arena_stats().peak;
  report.device_arena_bytes = device_.arena_stats().in_use;
  report.pinned_host_bytes = device_.pinned_stats().in_use;
  report.pageable_host_bytes = store_.pageable_ram_bytes();
  for (double seconds : previous_update_seconds) report.optimizer_seconds += seconds;
  {
    tiers::NvmeStateStoreStats now;
    for (const tiers::NvmeStateStoreStats& part :
         {store_.state_store() != nullptr ? store_.state_store()->stats()
                                          : tiers::NvmeStateStoreStats{},
          store_.nvme_gradients() != nullptr ? store_.nvme_gradients()->stats()
                                             : tiers::NvmeStateStoreStats{}}) {
      now.bytes_read += part.bytes_read;
      now.bytes_written += part.bytes_written;
      now.acquire_wait_seconds += part.acquire_wait_seconds + part.release_wait_seconds;
    }
    report.nvme_bytes_read = now.bytes_read - nvme_reported_.bytes_read;
    report.nvme_bytes_written = now.bytes_written - nvme_reported_.bytes_written;
    report.nvme_wait_seconds = now.acquire_wait_seconds - nvme_reported_.acquire_wait_seconds;
    nvme_reported_ = now;
  }

  std::vector<double> sums(static_cast<size_t>(store_.num_entries()));
  if (zero1_shards_.world() == 0) {
    for (int e = 0; e < store_.num_entries(); ++e) {
      sums[e] = store_.GradSumOfSquares(e, &optimizer_pool_);
    }
  } else {
    // ZeRO-1: each owner holds its ranges' reduced gradient; their norm partials are gathered.
    absl::StatusOr<std::vector<double>> gathered =
        OwnedGradSumsOfSquares(*comm, store_, zero1_shards_, &optimizer_pool_);
    if (!gathered.ok()) return gathered.status();
    sums = std::move(*gathered);
  }
  report.grad_norm = GlobalGradNorm(sums);
  report.learning_rate = LearningRateAt(options_.lr, step_ + 1);
  report.speculated_entries = speculation.count;
  report.speculation_seconds = speculation_seconds_;

  if (!GradNormIsFinite(report.grad_norm)) {
    report.skipped = true;
    // No update pass follows to rewrite what the speculation wrote in place.
    if (absl::Status s = DiscardSpeculation(speculation); !s.ok()) return s;
    ++skipped_steps_;
    ++consecutive_skips_;
    int first_bad = 0;
    while (first_bad < store_.num_entries() && std::isfinite(sums[first_bad])) ++first_bad;
    ++step_;
    gate_.ResetAll(step_);  // parameters unchanged, but this step's version is final
    report.skipped_total = skipped_steps_;
    if (consecutive_skips_ > options_.max_consecutive_skips) {
      const LayoutEntry& entry = layout_.entries()[first_bad];
      const std::string where =
          entry.layer >= 0 ? absl::StrCat(std::string(EntryKindName(entry.kind)), " ", entry.layer)
                           : std::string(EntryKindName(entry.kind));
      return absl::FailedPreconditionError(absl::StrCat(
          consecutive_skips_, " consecutive steps had a non-finite gradient norm (limit ",
          options_.max_consecutive_skips, "); first non-finite gradient in ", where));
    }
  } else {
    consecutive_skips_ = 0;
    report.planned_clip_coefficient = planned_clip;
    report.clip_coefficient =
        AppliedClipCoefficient(options_.grad_clip, planned_clip, report.grad_norm);
    previous_grad_norm_ = report.grad_norm;
    ++step_;
    // The coefficient the speculation ran with (the plan, else exactly 1.0): it is the update;
    // otherwise the pass below redoes every entry from the current state.
    report.speculation_committed =
        speculation.count > 0 && report.clip_coefficient == SpeculatedClipCoefficient(planned_clip);
    if (report.speculation_committed) CommitSpeculatedInRam(speculation.updated);
    LaunchUpdate(step_, report.clip_coefficient, report.learning_rate,
                 report.speculation_committed ? speculation.updated : std::vector<bool>{});
    if (zero1_shards_.world() != 0) {
      // The owners' new masters must reach every rank before the next forward reads them.
      WaitForUpdates();
      if (!update_status_.ok()) {
        return absl::Status(update_status_.code(),
                            absl::StrCat("optimizer update of step ", step_,
                                         " failed: ", update_status_.message()));
      }
      if (absl::Status s = BroadcastUpdatedMasters(*comm, store_, zero1_shards_); !s.ok()) {
        return s;
      }
      if (comm != nullptr) {
        report.communication_seconds = comm->stats().seconds - comm_before.seconds;
        report.communication_bytes = comm->stats().bytes_sent - comm_before.bytes_sent;
      }
    }
  }
  report.skipped_total = skipped_steps_;
  report.activation_blocks = std::move(activation_blocks);

  for (size_t d = 0; d < lanes.size(); ++d) {
    DeviceStepFigures figures;
    if (options_.collect_timeline) {
      figures = DeviceFiguresFromSpans(lanes[d].device->timeline().Spans());
    }
    figures.link_bytes =
        static_cast<uint64_t>(lanes[d].executor->layer_link_bytes() - link_bytes_before[d]);
    figures.micro_batches = ran->micro_batches_per_lane[d];
    report.devices.push_back(figures);
  }
  if (options_.collect_timeline) {
    report.layers.assign(static_cast<size_t>(dims_.num_layers), LayerTiming{});
    for (int i = 0; i < dims_.num_layers; ++i) {
      report.layers[i].optimizer_seconds = previous_update_seconds[layout_.layer_entry(i)];
    }
    std::vector<TimelineSpan> spans;
    for (const DeviceLane& lane : lanes) {
      lane.device->timeline().set_enabled(false);
      std::vector<TimelineSpan> lane_spans = lane.device->timeline().Spans();
      lane.executor->ObserveTimeline(lane_spans);
      spans.insert(spans.end(), lane_spans.begin(), lane_spans.end());
    }
    for (const TimelineSpan& span : spans) {
      const double seconds = static_cast<double>(span.end_ns - span.begin_ns) * 1e-9;
      const bool on_compute = span.stream == "compute";
      if (span.kind == SpanKind::kWait && on_compute) report.total_stall_seconds += seconds;
      if (span.kind == SpanKind::kCopyIn) report.total_copy_in_seconds += seconds;
      if (span.layer < 0 || span.layer >= dims_.num_layers) continue;
      LayerTiming& t = report.layers[span.layer];
      switch (span.kind) {
        case SpanKind::kCopyIn:
          t.copy_in_seconds += seconds;
          break;
        case SpanKind::kCompute:
          t.compute_seconds += seconds;
          break;
        case SpanKind::kCopyOut:
          t.copy_out_seconds += seconds;
          break;
        case SpanKind::kWait:
          if (on_compute) t.stall_seconds += seconds;
          break;
        default:
          break;
      }
    }
  }
  return report;
}

}  // namespace megatrain::engine
