// StreamingExecutor's activation modes: the policy's costs and decisions,
// the schedule rebuilt for them, and the offload and fetch copies around ops.
#include "engine/exec/streaming_executor_impl.h"

#include "absl/strings/str_cat.h"

namespace megatrain::engine {

using namespace executor_internal;  // NOLINT: the executor's own shapes

ActivationCosts StreamingExecutor::Impl::ActivationCostsOf() const {
  ActivationCosts c;
  c.num_layers = layout.schedule.num_layers;
  c.checkpoint_interval = layout.schedule.checkpoint_interval;
  c.keep_capacity_blocks = keep_capacity_blocks;
  if (c.num_layers > 0) {
    const size_t elements = store.spec(layout.schedule.first_layer_entry).elements;
    c.weight_bytes = static_cast<double>(elements * sizes.weight_element_bytes);
    c.gradient_bytes = static_cast<double>(elements * sizeof(float));
  }
  c.activation_set_bytes = static_cast<double>(sizes.activation_set_bytes);
  return c;
}

absl::Status StreamingExecutor::Impl::SetUpActivationPolicy() {
  ScheduleShape base = layout.schedule;
  base.block_modes.clear();
  working_sets = ActivationSetCount(base);
  const int k = base.checkpoint_interval;
  keep_capacity_blocks = base.keep_all ? 0 : (shape.activation_sets - working_sets) / k;
  std::vector<std::unique_ptr<Event>*> events;
  for (auto* list : {&set_written, &set_out_done, &set_fetch_gate, &set_in_ready}) {
    list->resize(static_cast<size_t>(working_sets));
    for (auto& e : *list) events.push_back(&e);
  }
  events.push_back(&offloads_done);
  for (auto* e : events) {
    absl::StatusOr<std::unique_ptr<Event>> created = device.CreateEvent();
    if (!created.ok()) return created.status();
    *e = std::move(*created);
  }
  ActivationDecision decision;
  if (options.block_modes.empty()) {
    activation_policy = std::make_unique<ActivationPolicy>(
        options.activation_policy, ActivationCostsOf(), options.activation_drift_threshold);
    decision = activation_policy->decision();
  } else {
    decision = ForcedDecision(layout.schedule);
  }
  return ApplyActivationDecision(decision);
}

absl::Status StreamingExecutor::Impl::ApplyActivationDecision(const ActivationDecision& decision) {
  ScheduleShape next = layout.schedule;
  next.block_modes = decision.modes();
  if (BlocksWithMode(next, ActivationMode::kKeep) > keep_capacity_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block_modes keep ", BlocksWithMode(next, ActivationMode::kKeep),
        " blocks below the top but the activation budget holds ", keep_capacity_blocks));
  }
  std::vector<ScheduledOp> ops = BuildStepSchedule(next);
  FragmentPlan fragments;
  if (fragment_mode()) {
    // Kept and offloaded blocks drop recompute ops, so the plan never needs
    // more fragments (and events) than the all-recompute one Create sized
    // (whatever modes the executor was created with).
    absl::StatusOr<FragmentPlan> planned = PlanFragments(ops, fragment_inputs);
    if (!planned.ok()) return planned.status();
    if (planned->fragments.size() > fragment_ready.size()) {
      return absl::InternalError(absl::StrCat("activation modes need ", planned->fragments.size(),
                                              " weight fragments; ", fragment_ready.size(),
                                              " events were created"));
    }
    fragments = std::move(*planned);
  }
  offloaded_sets.resize(static_cast<size_t>(next.num_layers));
  for (const ScheduledOp& op : ops) {
    if (!op.offload_activations || offloaded_sets[op.layer].data() != nullptr) continue;
    absl::StatusOr<PinnedHostBuffer> b = device.AllocatePinned(sizes.activation_set_bytes);
    if (!b.ok()) return b.status();
    offloaded_sets[op.layer] = std::move(*b);
  }
  layout.schedule = next;
  schedule = std::move(ops);
  if (fragment_mode()) step_fragments = std::move(fragments);
  activation_decision = decision;
  return absl::OkStatus();
}

void StreamingExecutor::Impl::EnqueueFetches(std::vector<ActivationFetch>& pending) {
  for (const ActivationFetch& f : pending) {
    copy_in->WaitEvent(*set_fetch_gate[f.set], {SpanKind::kWait, "activation set free", f.layer});
    copy_in->WaitEvent(*offloads_done, {SpanKind::kWait, "activations out", f.layer});
    copy_in->CopyHostToDevice(activation_sets[f.set].data(), offloaded_sets[f.layer].data(),
                              sizes.activation_set_bytes,
                              {SpanKind::kCopyIn, std::string(kFetchLabel), f.layer});
    copy_in->RecordEvent(*set_in_ready[f.set]);
    traffic.copy_in_bytes += static_cast<double>(sizes.activation_set_bytes);
  }
  pending.clear();
}

void StreamingExecutor::Impl::WaitForActivationSets(const ScheduledOp& op,
                                                    std::vector<bool>& offload_pending) {
  if (op.kind == StageKind::kLayerForward) {
    const size_t set = static_cast<size_t>(op.save_activations ? op.activation_set : 0);
    if (set < offload_pending.size() && offload_pending[set]) {
      compute->WaitEvent(*set_out_done[set], {SpanKind::kWait, "activations out", op.layer});
      offload_pending[set] = false;
    }
  }
  if (op.fetched_activations) {
    compute->WaitEvent(*set_in_ready[op.activation_set],
                       {SpanKind::kWait, "activations in", op.layer});
  }
}

void StreamingExecutor::Impl::AfterActivationOp(const ScheduledOp& op,
                                                std::vector<bool>& offload_pending,
                                                std::vector<ActivationFetch>& pending) {
  if (op.offload_activations) {
    const int set = op.activation_set;
    compute->RecordEvent(*set_written[set]);
    copy_out->WaitEvent(*set_written[set], {SpanKind::kWait, "activations ready", op.layer});
    copy_out->CopyDeviceToHost(offloaded_sets[op.layer].data(), activation_sets[set].data(),
                               sizes.activation_set_bytes,
                               {SpanKind::kCopyOut, std::string(kOffloadLabel), op.layer});
    copy_out->RecordEvent(*set_out_done[set]);
    copy_out->RecordEvent(*offloads_done);
    offload_pending[set] = true;
    traffic.copy_out_bytes += static_cast<double>(sizes.activation_set_bytes);
  }
  for (const ActivationFetch& f : op.fetch_after) {
    compute->RecordEvent(*set_fetch_gate[f.set]);
    pending.push_back(f);
  }
}

const ActivationDecision& StreamingExecutor::activation_decision() const {
  return impl_->activation_decision;
}

size_t StreamingExecutor::activation_set_bytes() const { return impl_->sizes.activation_set_bytes; }

bool StreamingExecutor::ObserveTimeline(const std::vector<TimelineSpan>& spans) {
  Impl& s = *impl_;
  const ActivationMeasurement measured = MeasureFromSpans(spans, s.traffic);
  s.traffic = LayerTraffic{};
  if (s.activation_policy == nullptr) return false;
  const bool changed = s.activation_policy->Observe(measured);
  ActivationDecision decision = s.activation_policy->decision();
  if (absl::Status applied = s.ApplyActivationDecision(decision); !applied.ok()) {
    // No pinned memory for new offloads: those blocks recompute instead.
    for (BlockDecision& block : decision.blocks) {
      if (block.mode != ActivationMode::kOffload) continue;
      block.mode = ActivationMode::kRecompute;
      block.reason = absl::StrCat("recompute: offload wanted but ", applied.message());
    }
    if (!s.ApplyActivationDecision(decision).ok()) return false;
  }
  schedule_ = s.schedule;
  return changed;
}

absl::Status StreamingExecutor::SetBlockModes(const std::vector<ActivationMode>& modes) {
  Impl& s = *impl_;
  ScheduleShape shape = s.layout.schedule;
  shape.block_modes = modes;
  const ActivationDecision decision = ForcedDecision(shape);
  if (absl::Status st = s.ApplyActivationDecision(decision); !st.ok()) return st;
  s.activation_policy.reset();
  schedule_ = s.schedule;
  return absl::OkStatus();
}

}  // namespace megatrain::engine
