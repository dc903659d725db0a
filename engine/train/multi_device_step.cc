// RunMicroBatchesOnLanes: one thread per extra device, losses combined in
// micro-batch order.
#include "engine/train/multi_device_step.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace megatrain::engine {
namespace {

// Everything one lane produced: per micro-batch its loss sum, or the first error.
struct LaneOutcome {
  std::vector<double> loss_sums;  // indexed by micro-batch
  absl::Status status;
  int failed_micro_batch = -1;
};

// Calls `final` for an entry once every lane has reported it (each lane's last micro-batch
// reports the entries whose shard or contribution it finished).
// After a failure it reports nothing: an aborted reduce-scatter leaves shards unreduced.
class FinalCountdown {
 public:
  FinalCountdown(int lanes, std::function<void(int)> final, const std::atomic<int>* first_failed)
      : lanes_(lanes), final_(std::move(final)), first_failed_(first_failed) {}
  void Reported(int entry) {
    {
      absl::MutexLock lock(&mu_);
      if (++reported_[entry] < lanes_) return;
    }
    if (first_failed_->load() >= 0) return;
    final_(entry);
  }

 private:
  const int lanes_;
  const std::function<void(int)> final_;
  const std::atomic<int>* first_failed_;
  absl::Mutex mu_;
  absl::flat_hash_map<int, int> reported_ ABSL_GUARDED_BY(mu_);
};

// The first micro-batch to fail is the cause: others may fail after it because it aborted the
// step (a reduce-scatter it never joins), and an earlier micro-batch can be among them.
struct StepAbort {
  GradientTurns* turns = nullptr;
  DeviceReduction* reduction = nullptr;
  std::atomic<int> first_failed{-1};
  void Abort(int micro_batch) {
    int none = -1;
    first_failed.compare_exchange_strong(none, micro_batch);
    if (turns != nullptr) turns->Abort();
    if (reduction != nullptr) reduction->Abort();
  }
};

void RunLane(const DeviceLane& lane, size_t lane_index, size_t lane_count, StepAbort* abort,
             const std::vector<const int32_t*>& inputs, const std::vector<const int32_t*>& targets,
             const std::vector<TokenLayout>& layouts, const MicroBatchStepArgs& args,
             FinalCountdown* countdown, LaneOutcome& outcome) {
  GradientTurns* turns = abort != nullptr ? abort->turns : nullptr;
  outcome.loss_sums.assign(inputs.size(), 0.0);
  // On CUDA this thread launches the device's kernels: it must be current here.
  if (absl::Status current = lane.device->MakeCurrent(); !current.ok()) {
    outcome.status = current;
    outcome.failed_micro_batch = static_cast<int>(lane_index);
    if (abort != nullptr) abort->Abort(outcome.failed_micro_batch);
    return;
  }
  for (size_t mb = lane_index; mb < inputs.size(); mb += lane_count) {
    // Another micro-batch failed: the step fails; the rest would only run into aborted turns
    // and reduce-scatters.
    if (abort != nullptr && abort->first_failed.load() >= 0) return;
    // A reduce-scatter passed its deadline (a hung peer): the step fails with that reason.
    if (args.reduction != nullptr && !args.reduction->Failure().ok()) return;
    MicroBatchTurns mb_turns;
    mb_turns.turns = turns;
    mb_turns.micro_batch = static_cast<int>(mb);
    mb_turns.first_on_device = mb == lane_index;
    const bool last_on_lane = mb + lane_count >= inputs.size();
    std::function<void(int)> on_final;
    if (countdown != nullptr && last_on_lane) {
      on_final = [countdown](int e) { countdown->Reported(e); };
    } else if (countdown == nullptr && mb + 1 == inputs.size()) {
      on_final = args.on_last_gradient_final;
    }
    absl::StatusOr<MicroBatchResult> r = lane.executor->RunMicroBatch(
        inputs[mb], targets[mb], args.inv_total_valid, mb == 0, args.weights_version,
        layouts.empty() ? TokenLayout{} : layouts[mb], mb_turns, on_final, last_on_lane);
    if (!r.ok()) {
      outcome.status = r.status();
      outcome.failed_micro_batch = static_cast<int>(mb);
      // Later micro-batches on other lanes may wait for this one's turns or reduce-scatters.
      if (abort != nullptr) abort->Abort(outcome.failed_micro_batch);
      return;
    }
    outcome.loss_sums[mb] = r->loss_sum;
  }
}

}  // namespace

absl::StatusOr<MicroBatchesResult> RunMicroBatchesOnLanes(
    const std::vector<DeviceLane>& lanes, GradientTurns& turns,
    const std::vector<const int32_t*>& inputs, const std::vector<const int32_t*>& targets,
    const std::vector<TokenLayout>& layouts, const MicroBatchStepArgs& args) {
  const size_t n = lanes.size();
  std::vector<LaneOutcome> outcomes(n);
  StepAbort abort;
  if (n == 1) {
    // A reduction among ranks (one device each) starts the step afresh as among devices.
    if (args.reduction != nullptr) args.reduction->Reset();
    RunLane(lanes[0], 0, 1, nullptr, inputs, targets, layouts, args, nullptr, outcomes[0]);
  } else {
    if (args.reduction != nullptr && inputs.size() < n) {
      // A device without a micro-batch would never join the reduce-scatters.
      return absl::InvalidArgumentError(absl::StrCat(
          "a step of ", inputs.size(), " micro-batches on ", n,
          " devices: gradient_reduction=devices needs at least one micro-batch per device"));
    }
    if (args.reduction != nullptr && args.reduce_every_micro_batch && inputs.size() % n != 0) {
      // Every micro-batch's reduce-scatters are joined by every device.
      return absl::InvalidArgumentError(absl::StrCat(
          "a step of ", inputs.size(), " micro-batches on ", n,
          " devices: gradient_reduction=device_shards needs the same number on every device"));
    }
    turns.Reset();
    if (args.reduction != nullptr) args.reduction->Reset();
    abort.turns = &turns;
    abort.reduction = args.reduction;
    std::unique_ptr<FinalCountdown> countdown;
    if (args.reduction != nullptr && args.on_last_gradient_final) {
      countdown =
          std::make_unique<FinalCountdown>(static_cast<int>(n), args.on_last_gradient_final,
                                           &abort.first_failed);
    }
    std::vector<std::thread> threads;
    for (size_t d = 1; d < n; ++d) {
      threads.emplace_back(RunLane, std::cref(lanes[d]), d, n, &abort, std::cref(inputs),
                           std::cref(targets), std::cref(layouts), std::cref(args),
                           countdown.get(), std::ref(outcomes[d]));
    }
    RunLane(lanes[0], 0, n, &abort, inputs, targets, layouts, args, countdown.get(),
            outcomes[0]);
    for (std::thread& t : threads) t.join();
  }
  const LaneOutcome* first_failure = nullptr;
  for (const LaneOutcome& o : outcomes) {
    if (o.status.ok()) continue;
    if (o.failed_micro_batch == abort.first_failed.load()) {
      first_failure = &o;
      break;
    }
    if (first_failure == nullptr || o.failed_micro_batch < first_failure->failed_micro_batch) {
      first_failure = &o;
    }
  }
  if (args.reduction != nullptr) {
    // A reduce-scatter that failed on the device (a hung peer's, aborted by its deadline) lets
    // the lanes finish on undefined sums: the step fails with the reduction's reason.
    if (absl::Status failed = args.reduction->Failure(); !failed.ok()) return failed;
  }
  if (first_failure != nullptr) {
    if (n == 1) return first_failure->status;
    return absl::Status(
        first_failure->status.code(),
        absl::StrCat("micro-batch ", first_failure->failed_micro_batch, " on device ",
                     first_failure->failed_micro_batch % n, ": ", first_failure->status.message()));
  }
  MicroBatchesResult result;
  for (size_t mb = 0; mb < inputs.size(); ++mb) result.loss_sum += outcomes[mb % n].loss_sums[mb];
  for (size_t d = 0; d < n; ++d) {
    result.micro_batches_per_lane.push_back(static_cast<int>((inputs.size() + n - 1 - d) / n));
  }
  return result;
}

absl::Status CheckTrainerDevices(const std::vector<Device*>& devices) {
  if (devices.empty()) {
    return absl::InvalidArgumentError("devices: a trainer needs at least one device");
  }
  for (size_t d = 0; d < devices.size(); ++d) {
    if (devices[d] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("devices[", d, "] is null"));
    }
    if (devices[d]->kind() != devices[0]->kind()) {
      return absl::InvalidArgumentError(
          absl::StrCat("devices[", d, "] is ", std::string(DeviceKindName(devices[d]->kind())),
                       " but devices[0] is ", std::string(DeviceKindName(devices[0]->kind())),
                       ": the devices of one job must be of one kind"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckMultiDevicePlacement(int devices, const StorePlacement& placement) {
  if (devices <= 1) return absl::OkStatus();
  // NVMe gradients are fine: an entry's chunks are begun, added to and ended within one
  // contribution, so its turn orders them as it orders RAM slabs. The compute copy's read-ahead is
  // not: a device waiting for a held chunk could wait on one whose copy another device holds back
  // behind a gradient turn of this one's earlier micro-batch.
  if (placement.compute_copy_on_nvme) {
    return absl::InvalidArgumentError(absl::StrCat(
        "devices=", devices,
        " needs the compute copy in RAM, but the placement puts it on NVMe "
        "(memory.compute_copy_on_nvme): its read-ahead follows one device's step order"));
  }
  return absl::OkStatus();
}

DeviceStepFigures DeviceFiguresFromSpans(const std::vector<TimelineSpan>& spans) {
  DeviceStepFigures f;
  for (const TimelineSpan& span : spans) {
    const double seconds = static_cast<double>(span.end_ns - span.begin_ns) * 1e-9;
    const bool on_compute = span.stream == "compute";
    if (span.kind == SpanKind::kWait && on_compute) f.stall_seconds += seconds;
    if (span.kind == SpanKind::kCopyIn) f.copy_in_seconds += seconds;
    if (span.kind == SpanKind::kCompute) f.compute_seconds += seconds;
    if (span.kind == SpanKind::kWait && span.label == kGradientTurnWaitLabel) {
      f.turn_wait_seconds += seconds;
    }
    if (span.label == kReduceScatterLabel) f.reduce_seconds += seconds;
  }
  return f;
}

}  // namespace megatrain::engine
