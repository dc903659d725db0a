// RunMicroBatchesOnLanes: one thread per extra device, losses combined in
// micro-batch order.
#include "engine/train/multi_device_step.h"

#include <string>
#include <thread>

#include "absl/strings/str_cat.h"

namespace megatrain::engine {
namespace {

// Everything one lane produced: per micro-batch its loss sum, or the first error.
struct LaneOutcome {
  std::vector<double> loss_sums;  // indexed by micro-batch
  absl::Status status;
  int failed_micro_batch = -1;
};

void RunLane(const DeviceLane& lane, size_t lane_index, size_t lane_count, GradientTurns* turns,
             const std::vector<const int32_t*>& inputs, const std::vector<const int32_t*>& targets,
             const std::vector<TokenLayout>& layouts, const MicroBatchStepArgs& args,
             LaneOutcome& outcome) {
  outcome.loss_sums.assign(inputs.size(), 0.0);
  // On CUDA this thread launches the device's kernels: it must be current here.
  if (absl::Status current = lane.device->MakeCurrent(); !current.ok()) {
    outcome.status = current;
    outcome.failed_micro_batch = static_cast<int>(lane_index);
    if (turns != nullptr) turns->Abort();
    return;
  }
  for (size_t mb = lane_index; mb < inputs.size(); mb += lane_count) {
    MicroBatchTurns mb_turns;
    mb_turns.turns = turns;
    mb_turns.micro_batch = static_cast<int>(mb);
    absl::StatusOr<MicroBatchResult> r = lane.executor->RunMicroBatch(
        inputs[mb], targets[mb], args.inv_total_valid, mb == 0, args.weights_version,
        layouts.empty() ? TokenLayout{} : layouts[mb], mb_turns,
        mb + 1 == inputs.size() ? args.on_last_gradient_final : nullptr,
        /*last_micro_batch=*/mb + lane_count >= inputs.size());
    if (!r.ok()) {
      outcome.status = r.status();
      outcome.failed_micro_batch = static_cast<int>(mb);
      // Later micro-batches on other lanes may wait for this one's turns.
      if (turns != nullptr) turns->Abort();
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
  if (n == 1) {
    RunLane(lanes[0], 0, 1, nullptr, inputs, targets, layouts, args, outcomes[0]);
  } else {
    turns.Reset();
    std::vector<std::thread> threads;
    for (size_t d = 1; d < n; ++d) {
      threads.emplace_back(RunLane, std::cref(lanes[d]), d, n, &turns, std::cref(inputs),
                           std::cref(targets), std::cref(layouts), std::cref(args),
                           std::ref(outcomes[d]));
    }
    RunLane(lanes[0], 0, n, &turns, inputs, targets, layouts, args, outcomes[0]);
    for (std::thread& t : threads) t.join();
  }
  const LaneOutcome* first_failure = nullptr;
  for (const LaneOutcome& o : outcomes) {
    if (o.status.ok()) continue;
    if (first_failure == nullptr || o.failed_micro_batch < first_failure->failed_micro_batch) {
      first_failure = &o;
    }
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

absl::Status CheckTrainerDevices(const std::vector<Device*>& devices,
                                 const dist::Communicator* communicator) {
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
  if (devices.size() > 1 && communicator != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("devices=", devices.size(),
                     " with a communicator is not supported: data parallelism runs either across "
                     "processes (one device each) or across the devices of one process"));
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
  }
  return f;
}

}  // namespace megatrain::engine
