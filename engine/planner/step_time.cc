// Op work of the schedule and the three-stream replay (protocol in step_time.h).
#include "engine/planner/step_time.h"

#include <algorithm>
#include <array>
#include <limits>

#include "engine/exec/fragment_plan.h"
#include "engine/exec/weight_slot_policy.h"
#include "engine/planner/speculation_time.h"

namespace megatrain::engine::planner {
namespace {

// Causal attention matmuls of one forward: QK^T and PV over the lower triangle.
double AttentionForwardFlops(const ModelDims& m) {
  const double s = static_cast<double>(m.seq);
  return 2.0 * 2.0 * m.batch * m.q_heads * m.head_dim * s * (s + 1) / 2.0;
}

double LayerGemmForwardFlops(const ModelDims& m) {
  const double n = static_cast<double>(m.tokens());
  const double d = m.hidden, q = m.q_width(), kv = m.kv_width(), f = m.ffn;
  return 2.0 * n * d * (q + 2 * kv) + 2.0 * n * q * d + 3 * 2.0 * n * d * f;
}

// Elements read or written by one layer forward's non-GEMM work: norms, RoPE, residual adds,
// SwiGLU, the input copy, and one pass of the softmax over the causal scores.
double LayerElementwiseForward(const ModelDims& m) {
  const double n = static_cast<double>(m.tokens());
  const double s = static_cast<double>(m.seq);
  return n * (12.0 * m.hidden + 2.0 * m.q_width() + 2.0 * m.kv_width() + 3.0 * m.ffn) +
         3.0 * m.batch * m.q_heads * s * (s + 1) / 2.0;
}

double CopySeconds(double bytes, double gbps, const HardwareProfile& hw, int copies) {
  if (bytes <= 0) return 0;
  const double memcpy_gbps = hw.memcpy_gbps > 0 ? hw.memcpy_gbps : gbps;
  double seconds = bytes / (memcpy_gbps * 1e9);
  if (gbps > 0) seconds = std::max(seconds, bytes / (gbps * 1e9));
  return seconds + copies * hw.link_latency_us * 1e-6;
}

// Seconds to move `bytes` at `gbps` (0 bytes: 0; no bandwidth given: never finishes).
double NvmeSeconds(double bytes, double gbps) {
  if (bytes <= 0) return 0;
  return gbps > 0 ? bytes / (gbps * 1e9) : std::numeric_limits<double>::infinity();
}

// Fragment mode: the weight byte stream through the ring, and when each op's compute read it.
class RingStream {
 public:
  explicit RingStream(double ring_bytes) : ring_bytes_(ring_bytes) {}

  double next_position() const { return position_; }

  // When the stream bytes before `x` had all been read by their op (0 before the stream).
  double FreedUpTo(double x) const {
    if (x <= 0 || uses_.empty()) return 0;
    auto it = std::lower_bound(uses_.begin(), uses_.end(), x,
                               [](const Use& u, double v) { return u.end < v; });
    if (it == uses_.end()) return uses_.back().compute_end;
    const double fraction = it->end > it->start ? (x - it->start) / (it->end - it->start) : 1;
    return it->compute_start + (it->compute_end - it->compute_start) * std::clamp(fraction, 0., 1.);
  }

  void Add(double bytes, double compute_start, double compute_end) {
    uses_.push_back({position_, position_ + bytes, compute_start, compute_end});
    position_ += bytes;
  }

  double ring_bytes() const { return ring_bytes_; }

 private:
  struct Use {
    double start, end;  // stream bytes
    double compute_start, compute_end;
  };
  double ring_bytes_;
  double position_ = 0;
  std::vector<Use> uses_;
};

}  // namespace

double OpComputeSeconds(const OpWork& o, const HardwareProfile& hw) {
  return (o.gemm_flops + o.attention_flops) / (hw.dense_tflops * 1e12 * hw.compute_efficiency) +
         o.elementwise_bytes / (hw.device_memory_gbps * 1e9);
}

StepWork BuildStepWork(const ExecutorGeometry& g, const ExecutorOptions& options, int weight_slots,
                       int micro_batches, const HardwareProfile& hw, double flop_parameters) {
  ScheduleShape shape = g.layout.schedule;
  shape.checkpoint_interval = options.checkpoint_interval;
  shape.keep_all = options.keep_all;
  shape.block_modes = options.block_modes;
  const std::vector<ScheduledOp> schedule = BuildStepSchedule(shape);
  const ModelDims& m = g.dims;
  const double n = static_cast<double>(m.tokens());
  const double a = hw.activation_bytes;
  const int checkpoints = CheckpointCount(shape);
  const int device_checkpoints = options.device_checkpoints < 0
                                     ? checkpoints
                                     : std::min(options.device_checkpoints, checkpoints);
  const double x_bytes = n * m.hidden * a;
  const size_t activation_set_bytes =
      StreamingExecutor::SizesFor(hw.cpu_device ? DeviceKind::kCpu : DeviceKind::kCuda, m)
          .activation_set_bytes;

  StepWork w;
  for (size_t e : g.entry_elements) {
    w.entry_elements.push_back(static_cast<double>(e));
    w.optimizer_elements += static_cast<double>(e);
  }
  const bool ring = options.weight_ring_bytes > 0;
  // Fragment mode: each op's copies are the fragments the executor's plan cuts its tensors into.
  std::vector<int> op_fragments(schedule.size(), 0);
  if (ring) {
    const absl::StatusOr<FragmentPlan> plan =
        StepFragmentPlanFor(g, options, hw.cpu_device ? DeviceKind::kCpu : DeviceKind::kCuda);
    if (plan.ok()) {
      for (const WeightFragment& f : plan->fragments) ++op_fragments[plan->tensors[f.tensor].op];
    }
  }
  WeightSlotPolicy policy(std::max(2, weight_slots));
  std::vector<bool> contributed(g.entry_elements.size(), false);
  // Gradients summed on the device (GradientAccumulation::kDevice, a step of several
  // micro-batches): a device copy (first) or add (later) per micro-batch, and one copy-out of the
  // sums in the last; no host adds.
  const std::vector<bool> summed =
      options.gradient_accumulation == GradientAccumulation::kDevice && micro_batches > 1
          ? DeviceSummedEntries(schedule, g.entry_elements.size())
          : std::vector<bool>(g.entry_elements.size(), false);
  for (int mb = 0; mb < micro_batches; ++mb) {
    for (size_t i = 0; i < schedule.size(); ++i) {
      const ScheduledOp& op = schedule[i];
      OpWork o;
      o.op = op;
      const double stage = static_cast<double>(StageFloats(g, op.entries));
      if (ring ? !op.entries.empty() : policy.Place(op.entries, /*version=*/1).copy) {
        for (int e : op.entries) o.weight_bytes += g.entry_elements[e] * hw.weight_bytes;
        // Through the ring a training head reads its blocks (and the final norm) twice: for
        // the loss, then again for the gradients (exec/fragment_parts.h HeadStepAt).
        if (ring && op.kind == StageKind::kHead && op.produces_gradients) o.weight_bytes *= 2;
        o.copy_in_bytes += o.weight_bytes;
        o.copies +=
            ring && op_fragments[i] > 0 ? op_fragments[i] : static_cast<int>(op.entries.size());
      }
      switch (op.kind) {
        case StageKind::kEmbedForward:
          // The batch's rows are gathered on the host and copied in.
          o.copy_in_bytes += x_bytes;
          ++o.copies;
          break;
        case StageKind::kLayerForward:
          o.gemm_flops = LayerGemmForwardFlops(m);
          o.attention_flops = AttentionForwardFlops(m);
          o.elementwise_bytes = LayerElementwiseForward(m) * a;
          if (op.offload_activations) {
            o.copy_out_bytes += static_cast<double>(activation_set_bytes);
          }
          if (op.checkpoint >= 0 && op.checkpoint >= device_checkpoints) {
            if (op.recompute) {
              o.copy_in_bytes += x_bytes;
              ++o.copies;
            } else {
              o.copy_out_bytes += x_bytes;
            }
          }
          break;
        case StageKind::kHead:
          // Logits, and in vocabulary blocks (exec/fragment_parts.h) logits again, dh and dW.
          o.gemm_flops = 8.0 * n * m.hidden * m.vocab;
          o.elementwise_bytes = (4.0 * n * m.vocab + 6.0 * n * m.hidden) * a + stage * 4;
          break;
        case StageKind::kLayerBackward:
          o.gemm_flops = 2 * LayerGemmForwardFlops(m);
          o.attention_flops = 2.5 * AttentionForwardFlops(m);
          o.elementwise_bytes = 2.5 * LayerElementwiseForward(m) * a + stage * 4;
          break;
        case StageKind::kEmbedBackward:
          // The rows' gradients are copied out and scatter-added on the host
          // (the slab is zeroed first on its first contribution).
          o.copy_out_bytes += n * m.hidden * hw.grad_bytes;
          if (!contributed[op.host_entry]) {
            o.accumulate_elements += g.entry_elements[op.host_entry] / 3;  // a zeroing pass
          }
          o.accumulate_elements += n * m.hidden;
          contributed[op.host_entry] = true;
          break;
      }
      for (size_t f = 0; f < op.fetch_after.size(); ++f) {
        // Fetched sets ride on copy_in after the op that frees their set.
        o.copy_in_bytes += static_cast<double>(activation_set_bytes);
        ++o.copies;
      }
      if (op.produces_gradients) {
        double kept = 0;  // floats of the stage summed on the device, not copied out now
        for (int e : op.entries) {
          const double elements = g.entry_elements[e];
          if (summed[e]) {
            o.elementwise_bytes += (mb == 0 ? 8.0 : 12.0) * elements;  // fp32 copy or add
            if (mb + 1 < micro_batches) {
              kept += elements;
              o.kept_on_device.push_back(e);
            }
          } else if (contributed[e]) {
            o.accumulate_elements += elements;
          }
          contributed[e] = true;
        }
        o.gradient_bytes = std::max(0.0, stage - kept) * hw.grad_bytes;
        o.copy_out_bytes += o.gradient_bytes;
      }
      w.hardware_flops += o.gemm_flops + o.attention_flops;
      w.ops.push_back(std::move(o));
    }
  }
  w.tokens = n * micro_batches;
  w.micro_batches = micro_batches;
  w.weight_slots = std::max(2, weight_slots);
  w.weight_ring_bytes = static_cast<double>(options.weight_ring_bytes);
  w.parameters = flop_parameters;
  w.model_flops =
      (6.0 * flop_parameters * n + 3.0 * m.num_layers * AttentionForwardFlops(m)) * micro_batches;
  return w;
}

void AddNvmeGradientTraffic(StepWork& w, const std::vector<double>& gradient_bytes) {
  std::vector<bool> written(gradient_bytes.size(), false);
  for (OpWork& o : w.ops) {
    if (!o.op.produces_gradients) continue;
    for (int e : o.op.entries) {
      // Summed on the device: nothing leaves before the step's last micro-batch.
      if (std::find(o.kept_on_device.begin(), o.kept_on_device.end(), e) !=
          o.kept_on_device.end()) {
        continue;
      }
      if (e < 0 || static_cast<size_t>(e) >= gradient_bytes.size() || gradient_bytes[e] <= 0) {
        continue;
      }
      o.nvme_write_bytes += gradient_bytes[e];
      if (written[e]) o.nvme_read_bytes += gradient_bytes[e];
      written[e] = true;
    }
  }
}

void AddNvmeWeightTraffic(StepWork& w, const std::vector<double>& compute_copy_bytes) {
  for (OpWork& o : w.ops) {
    if (o.weight_bytes <= 0) continue;  // its slot already holds the weights
    // A training head through the ring reads its weights twice (BuildStepWork).
    const double reads =
        w.weight_ring_bytes > 0 && o.op.kind == StageKind::kHead && o.op.produces_gradients ? 2
                                                                                          : 1;
    for (int e : o.op.entries) {
      if (e >= 0 && static_cast<size_t>(e) < compute_copy_bytes.size()) {
        o.nvme_weight_bytes += reads * compute_copy_bytes[e];
      }
    }
  }
}

StepTimeEstimate EstimateStepTime(const StepWork& w, const HardwareProfile& hw,
                                  const NvmeEntryIo& nvme) {
  StepTimeEstimate t;
  const double host_bw = hw.host_memory_gbps * 1e9;

  // Host optimizer of the previous step, entry by entry in forward order.
  const size_t entries = w.entry_elements.size();
  std::vector<double> update_done(entries, 0.0);
  // Speculative update: the pass's per-entry seconds, replayed after the streams.
  const bool speculate = w.speculative_update && entries > 0;
  SpeculationInputs speculation;
  speculation.entry_final.assign(entries, -1.0);
  double clock_cpu = 0, clock_io = 0, clock_both = 0;
  for (size_t e = 0; e < entries; ++e) {
    const double adamw = w.entry_elements[e] / hw.AdamwParamsPerSecond();
    double io = 0;
    if (e < nvme.optimizer_read.size())
      io += NvmeSeconds(nvme.optimizer_read[e], hw.nvme_read_gbps);
    if (e < nvme.optimizer_written.size()) {
      io += NvmeSeconds(nvme.optimizer_written[e], hw.nvme_write_gbps);
    }
    t.optimizer_seconds += adamw;
    if (speculate) {
      // The gradient is read from the staging its last copy-out left, not from the disk.
      double read = e < nvme.optimizer_read.size() ? nvme.optimizer_read[e] : 0;
      if (e < nvme.gradient_bytes.size()) read = std::max(0.0, read - nvme.gradient_bytes[e]);
      const double written = e < nvme.optimizer_written.size() ? nvme.optimizer_written[e] : 0;
      const double spec_io =
          NvmeSeconds(read, hw.nvme_read_gbps) + NvmeSeconds(written, hw.nvme_write_gbps);
      t.nvme_optimizer_seconds += spec_io;
      speculation.entry_nvme_seconds.push_back(spec_io);
      speculation.entry_seconds.push_back(hw.cpu_device ? spec_io : std::max(adamw, spec_io));
      continue;  // the previous step's pass ended within that step: nothing gates this forward
    }
    t.nvme_optimizer_seconds += io;
    const double gather = e < w.entry_gather_seconds.size() ? w.entry_gather_seconds[e] : 0;
    clock_cpu += adamw;
    clock_io += io + gather;
    clock_both += std::max(adamw, io) + gather;
    // CPU device: AdamW's time is charged in full below, so only I/O gates the forward.
    update_done[e] = hw.cpu_device ? clock_io : clock_both;
  }
  t.grad_norm_seconds = w.optimizer_elements * 4 / host_bw;

  // Replay of the three streams.
  double copy_in_free = 0, compute_free = 0, copy_out_free = 0;
  std::array<double, 2> grad_free = {0, 0};
  int grad = 0;
  // Slots: the executor's policy placed weights; for timing, a copy into the slot read two
  // copying ops ago is the double-buffering constraint.
  std::vector<double> reader_done_of_copy;  // compute end of each op that copied weights
  RingStream ring(w.weight_ring_bytes);
  for (const OpWork& o : w.ops) {
    const double compute = OpComputeSeconds(o, hw);
    // From NVMe, a weight copy reads the compute copy ahead of the link: the slower one bounds it.
    const double nvme_weights = NvmeSeconds(o.nvme_weight_bytes, hw.nvme_read_gbps);
    const double copy_in =
        std::max(CopySeconds(o.copy_in_bytes, hw.h2d_gbps, hw, o.copies), nvme_weights);
    t.nvme_weights_seconds += nvme_weights;
    const double nvme_write = NvmeSeconds(o.nvme_write_bytes, hw.nvme_write_gbps);
    const double nvme_read = NvmeSeconds(o.nvme_read_bytes, hw.nvme_read_gbps);
    t.nvme_backward_seconds += nvme_write + nvme_read;
    const double copy_out =
        std::max(CopySeconds(o.copy_out_bytes, hw.d2h_gbps, hw, o.copy_out_bytes > 0 ? 1 : 0),
                 nvme_write) +
        nvme_read + o.accumulate_elements * 12 / host_bw + o.reduce_seconds;
    t.compute_seconds += compute;
    t.copy_in_seconds += copy_in;
    t.copy_out_seconds += copy_out;

    if (w.weight_ring_bytes > 0 && o.weight_bytes > 0) {
      // Fragment mode (protocol in step_time.h); a fragment is the op's mean one.
      const double bytes = o.weight_bytes;
      const double first = ring.next_position();
      const int fragments = std::max(1, o.copies);
      const double fragment_seconds = copy_in / fragments;
      double start =
          std::max(copy_in_free, ring.FreedUpTo(first - ring.ring_bytes() + bytes / fragments));
      for (int e : o.op.entries) start = std::max(start, update_done[e]);
      double end = start + copy_in;
      const double tail = first + bytes - ring.ring_bytes();  // the last byte it overwrites
      if (tail <= first) end = std::max(end, ring.FreedUpTo(tail) + fragment_seconds);
      double begin = std::max({compute_free, start + fragment_seconds, end - compute});
      if (o.op.produces_gradients) begin = std::max(begin, grad_free[grad]);
      if (tail > first) {
        // A ring smaller than the op: its last bytes wait for its own first ones to be read.
        end = std::max(end, begin + compute * (tail - first) / bytes + fragment_seconds);
      }
      const double finish = std::max(begin + compute, end + compute / fragments);
      t.stall_seconds += finish - compute - compute_free;
      ring.Add(bytes, begin, finish);
      copy_in_free = end;
      compute_free = finish;
    } else {
      double ready = compute_free;
      if (copy_in > 0) {
        double start = copy_in_free;
        // The slot being refilled was last read by the op that copied `weight_slots` copies
        // ago (two slots: double buffering).
        const size_t c = reader_done_of_copy.size();
        const size_t slots = static_cast<size_t>(w.weight_slots);
        const bool fills_slot = !o.op.entries.empty();
        if (fills_slot && c >= slots) start = std::max(start, reader_done_of_copy[c - slots]);
        for (int e : o.op.entries) start = std::max(start, update_done[e]);
        if (o.op.host_entry >= 0) start = std::max(start, update_done[o.op.host_entry]);
        copy_in_free = start + copy_in;
        ready = std::max(ready, copy_in_free);
      }
      if (o.op.produces_gradients) ready = std::max(ready, grad_free[grad]);
      t.stall_seconds += ready - compute_free;
      compute_free = ready + compute;
      if (copy_in > 0 && !o.op.entries.empty()) reader_done_of_copy.push_back(compute_free);
    }
    if (o.op.produces_gradients || copy_out > 0) {
      const double copy_out_start = std::max(copy_out_free, compute_free);
      copy_out_free = copy_out_start + copy_out;
      if (o.op.produces_gradients) {
        grad_free[grad] = copy_out_free;
        grad ^= 1;
      }
      if (speculate) {
        // The last contribution's copy-out ending makes an entry's gradient final.
        if (o.op.produces_gradients) {
          for (int e : o.op.entries) {
            if (e >= 0 && static_cast<size_t>(e) < entries) {
              speculation.entry_final[e] = copy_out_free;
            }
          }
        }
        if (o.op.kind == StageKind::kEmbedBackward && o.op.host_entry >= 0 &&
            static_cast<size_t>(o.op.host_entry) < entries) {
          speculation.entry_final[o.op.host_entry] = copy_out_free;
        }
        speculation.backward_nvme.push_back(
            {copy_out_start, copy_out_free, nvme_write + nvme_read});
      }
    }
  }
  t.nvme_seconds = t.nvme_optimizer_seconds + t.nvme_backward_seconds + t.nvme_weights_seconds;
  t.pipeline_seconds = std::max(compute_free, copy_out_free);
  t.step_seconds = t.pipeline_seconds + t.grad_norm_seconds;
  if (speculate) {
    // The commit needs the norm (is the coefficient 1?) and the whole pass.
    const SpeculationTiming pass = ReplaySpeculation(speculation);
    t.speculation_end_seconds = pass.end;
    t.speculation_exposed_seconds = std::max(0.0, pass.end - t.step_seconds);
    t.step_seconds += t.speculation_exposed_seconds;
    if (hw.cpu_device) t.step_seconds += t.optimizer_seconds;
  } else if (hw.cpu_device) {
    t.step_seconds += t.optimizer_seconds;
  } else {
    t.step_seconds = std::max(t.step_seconds, clock_both + t.grad_norm_seconds);
  }

  const std::pair<const char*, double> busy[] = {
      {"compute", t.compute_seconds},
      {"copy-in", t.copy_in_seconds},
      {"copy-out", t.copy_out_seconds},
      {"host optimizer", t.optimizer_seconds + t.grad_norm_seconds},
      {"nvme", t.nvme_seconds},
  };
  double most = -1;
  for (const auto& [name, seconds] : busy) {
    if (seconds > most) {
      most = seconds;
      t.bottleneck = name;
    }
  }
  t.tokens_per_second = w.tokens / t.step_seconds;
  t.model_tflops = w.model_flops / t.step_seconds / 1e12;
  t.hardware_tflops = w.hardware_flops / t.step_seconds / 1e12;
  return t;
}

}  // namespace megatrain::engine::planner
