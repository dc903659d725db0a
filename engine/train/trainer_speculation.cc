// The trainer's speculative update (TrainerOptions::speculative_update): starting, committing and
// discarding the AdamW update that runs during the last micro-batch's backward.
#include <chrono>
#include <memory>
#include <vector>

#include "engine/optimizer/grad_norm.h"
#include "engine/train/trainer.h"
#include "kernels/common/adamw.h"

namespace megatrain::engine {

void Trainer::BeginSpeculation(uint64_t weights_version, double planned_coefficient) {
  const double coefficient = SpeculatedClipCoefficient(planned_coefficient);
  // Exactly the scalars LaunchUpdate makes for this step when its clip coefficient is
  // `coefficient`: the same function of the same values, so a committed speculation is the
  // update bit for bit.
  const long long t = static_cast<long long>(applied_updates_ + 1);
  const double lr = LearningRateAt(options_.lr, step_ + 1);
  const auto decay = kernels::MakeAdamwStepScalars(lr, options_.beta1, options_.beta2, options_.eps,
                                                   options_.weight_decay, t, coefficient);
  const auto no_decay = kernels::MakeAdamwStepScalars(lr, options_.beta1, options_.beta2,
                                                      options_.eps, 0.0, t, coefficient);
  speculation_seconds_ = 0;
  // Sums of squares of the gradients final so far (the others count 0): their norm is a lower
  // bound of the step's (sums of non-negative terms in a fixed order only grow, and so do the
  // rounded ones), so once it clips the step's coefficient cannot be 1 (once coefficient x bound
  // passes the clip, the plan cannot be applied) and the rest of the speculation would be
  // discarded work. A non-finite bound does not stop it: such steps are
  // rare (and counted), and their speculation is discarded whole (DiscardSpeculation).
  auto partial_sums = std::make_shared<std::vector<double>>(store_.num_entries(), 0.0);
  speculation_->Begin(
      [this, weights_version] {
        // The previous step's update pass uses the state file until it publishes its last
        // entry, and a checkpoint being written reads it: the file must be this thread's alone.
        // All in RAM the speculation reads the current state the pass leaves and writes only the
        // alternates (and the compute copy, which no checkpoint reads): a checkpoint may go on
        // beside it, and the commit waits for it instead (CommitSpeculatedInRam). The mixed form
        // (the master in RAM, m and v on NVMe) uses the file: it waits like the NVMe form.
        for (int e = 0; e < store_.num_entries(); ++e) gate_.WaitFor(e, weights_version);
        if (store_.state_store() == nullptr) return;
        absl::MutexLock lock(&snapshot_mu_);
        auto no_snapshot = [this]() ABSL_SHARED_LOCKS_REQUIRED(snapshot_mu_) {
          return !snapshot_active_;
        };
        snapshot_mu_.Await(absl::Condition(&no_snapshot));
      },
      [this, decay, no_decay, partial_sums, planned_coefficient](int e) -> absl::StatusOr<bool> {
        const auto t0 = std::chrono::steady_clock::now();
        (*partial_sums)[e] = store_.GradSumOfSquares(e, &optimizer_pool_);
        const double lower_bound = GlobalGradNorm(*partial_sums);
        if (!SpeculationCanCommit(options_.grad_clip, planned_coefficient, lower_bound)) {
          return false;
        }
        absl::Status s = UpdateEntry(e, decay, no_decay, /*speculative=*/true);
        speculation_seconds_ +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (!s.ok()) return s;
        return true;
      });
}

absl::Status Trainer::DiscardSpeculation(const SpeculativeUpdate::Outcome& outcome) {
  // The alternate regions (or arrays) are simply never committed; the compute copy was written
  // in place (on the CPU device with the master in RAM there is none: nothing to undo). It is
  // rewritten from the current master wherever that is: in RAM (the RAM and mixed forms) or on
  // NVMe.
  absl::Status status;
  for (int e = 0; e < store_.num_entries(); ++e) {
    if (e < static_cast<int>(outcome.updated.size()) && outcome.updated[e]) {
      status.Update(store_.has_alternate_ram_state() ? store_.RestoreComputeCopyFromRamMaster(e)
                                                     : store_.RestoreComputeCopyFromNvmeMaster(e));
    }
  }
  return status;
}

void Trainer::CommitSpeculated(int e) {
  // The state file's part (all of it on NVMe; m and v in the mixed form, whose master
  // CommitSpeculatedInRam swapped already); all in RAM there is none.
  tiers::NvmeStateStore* states = store_.state_store();
  if (states == nullptr) return;
  for (int c = 0; c < store_.chunks().num_chunks(e); ++c) {
    states->Commit(store_.chunks().chunk(e, c).unit);
  }
}

void Trainer::CommitSpeculatedInRam(const std::vector<bool>& updated) {
  if (!store_.has_alternate_ram_state()) return;
  for (int e = 0; e < store_.num_entries() && e < static_cast<int>(updated.size()); ++e) {
    if (!updated[e]) continue;
    {
      // A checkpoint being written reads the pre-step master, m and v: swap after it.
      absl::MutexLock lock(&snapshot_mu_);
      auto written = [this, e]() ABSL_SHARED_LOCKS_REQUIRED(snapshot_mu_) {
        return !snapshot_active_ || snapshot_done_[e];
      };
      snapshot_mu_.Await(absl::Condition(&written));
    }
    store_.SwapAlternateState(e);
  }
}

AdamwArrays Trainer::UpdateTargets(float* master, float* m, float* v,
                                   const EntryBuffers& alternate, size_t first) {
  if (alternate.master == nullptr) return AdamwArrays::InPlace(master, m, v);
  // The mixed form has no m and v arrays: they are updated in the staging, in place, and
  // ReleaseToAlternate writes them to the state file's alternate regions.
  return AdamwArrays{master,
                     m,
                     v,
                     alternate.master + first,
                     alternate.m != nullptr ? alternate.m + first : m,
                     alternate.v != nullptr ? alternate.v + first : v};
}

}  // namespace megatrain::engine
