// DaemonMetrics (see metrics.h).
#include "server/metrics.h"

#include <algorithm>
#include <string>

namespace megatrain::server {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

// Seconds from 10 us to ~10 s, for per-layer and per-step timings.
prometheus::Histogram::BucketBoundaries SecondsBuckets() {
  return {1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1, 3, 10};
}

}  // namespace

DaemonMetrics::DaemonMetrics(prometheus::Registry& r)
    : layer_copy_in_(BuildHistogram()
                         .Name("megatrain_layer_copy_in_seconds")
                         .Help("Host-to-device weight copy time of a decoder layer per step")
                         .Register(r)),
      layer_compute_(BuildHistogram()
                         .Name("megatrain_layer_compute_seconds")
                         .Help("Forward+backward compute time of a decoder layer per step")
                         .Register(r)),
      layer_copy_out_(BuildHistogram()
                          .Name("megatrain_layer_copy_out_seconds")
                          .Help("Device-to-host gradient copy time of a decoder layer per step")
                          .Register(r)),
      layer_stall_(BuildHistogram()
                       .Name("megatrain_layer_stall_seconds")
                       .Help("Time compute waited for a decoder layer's transfers per step")
                       .Register(r)),
      layer_optimizer_(BuildHistogram()
                           .Name("megatrain_layer_optimizer_seconds")
                           .Help("AdamW update time of a decoder layer per step")
                           .Register(r)),
      layer_overlap_(BuildGauge()
                         .Name("megatrain_layer_overlap_ratio")
                         .Help("1 - stall/copy_in of a decoder layer in the last step")
                         .Register(r)),
      device_stall_(BuildHistogram()
                        .Name("megatrain_device_stall_seconds")
                        .Help("Time a device's compute waited for its transfers per step "
                              "(label rank: the device's index in the job)")
                        .Register(r)),
      device_compute_(BuildHistogram()
                          .Name("megatrain_device_compute_seconds")
                          .Help("Compute time of a device per step (label rank)")
                          .Register(r)),
      device_link_bytes_(BuildCounter()
                             .Name("megatrain_device_link_bytes_total")
                             .Help("Bytes a device's host link carried for decoder layers "
                                   "(weights, gradients, activations; label rank)")
                             .Register(r)),
      device_turn_wait_(BuildHistogram()
                            .Name("megatrain_device_turn_wait_seconds")
                            .Help("Time a device's copy-outs waited per step for earlier "
                                  "micro-batches' gradients on other devices (label rank)")
                            .Register(r)),
      device_reduce_(BuildHistogram()
                         .Name("megatrain_device_reduce_seconds")
                         .Help("Time a device spent per step in reduce-scatters of its gradient "
                               "sums among the job's devices, waits for peers included (label "
                               "rank; 0 unless gradient_reduction is devices)")
                         .Register(r)),
      overlap_ratio_(BuildGauge()
                         .Name("megatrain_train_overlap_ratio")
                         .Help("1 - stall/copy_in over the whole last step")
                         .Register(r)
                         .Add({})),
      tokens_per_second_(BuildGauge()
                             .Name("megatrain_train_tokens_per_second")
                             .Help("Tokens per second of the last step")
                             .Register(r)
                             .Add({})),
      loss_(BuildGauge()
                .Name("megatrain_train_loss")
                .Help("Training loss of the last step")
                .Register(r)
                .Add({})),
      validation_loss_(BuildGauge()
                           .Name("megatrain_train_validation_loss")
                           .Help("Latest validation loss of the running job")
                           .Register(r)
                           .Add({})),
      learning_rate_(BuildGauge()
                         .Name("megatrain_train_learning_rate")
                         .Help("Learning rate of the last step")
                         .Register(r)
                         .Add({})),
      optimizer_seconds_(BuildHistogram()
                             .Name("megatrain_train_optimizer_seconds")
                             .Help("AdamW update time of a whole step")
                             .Register(r)
                             .Add({}, SecondsBuckets())),
      step_seconds_(BuildHistogram()
                        .Name("megatrain_train_step_seconds")
                        .Help("Forward+backward time of a step")
                        .Register(r)
                        .Add({}, SecondsBuckets())),
      steps_(BuildCounter()
                 .Name("megatrain_train_steps_total")
                 .Help("Optimizer steps run by this daemon")
                 .Register(r)
                 .Add({})),
      tokens_(BuildCounter()
                  .Name("megatrain_train_tokens_total")
                  .Help("Tokens processed by this daemon")
                  .Register(r)
                  .Add({})),
      nvme_read_bytes_(BuildCounter()
                           .Name("megatrain_nvme_read_bytes_total")
                           .Help("Bytes the NVMe tier read (optimizer state, gradients)")
                           .Register(r)
                           .Add({})),
      nvme_written_bytes_(BuildCounter()
                              .Name("megatrain_nvme_written_bytes_total")
                              .Help("Bytes the NVMe tier wrote: what wears the drive")
                              .Register(r)
                              .Add({})),
      memory_bytes_(BuildGauge()
                        .Name("megatrain_memory_bytes")
                        .Help("Bytes in use per memory tier after the last step")
                        .Register(r)),
      arena_peak_(BuildGauge()
                      .Name("megatrain_device_arena_peak_bytes")
                      .Help("Peak bytes allocated from the device arena in the last step")
                      .Register(r)
                      .Add({})),
      activation_block_mode_(BuildGauge()
                                 .Name("megatrain_activation_block_mode")
                                 .Help("1 for the mode (keep, offload, recompute) each block of "
                                       "layers ran its activations with in the last step, else 0")
                                 .Register(r)),
      queue_length_(BuildGauge()
                        .Name("megatrain_daemon_queue_length")
                        .Help("Jobs waiting in the queue")
                        .Register(r)
                        .Add({})),
      jobs_(BuildGauge()
                .Name("megatrain_daemon_jobs")
                .Help("Jobs known to the daemon by state")
                .Register(r)),
      healthy_(BuildGauge()
                   .Name("megatrain_daemon_healthy")
                   .Help("1 while the device is healthy, 0 after a device fault")
                   .Register(r)
                   .Add({})),
      rpcs_(BuildCounter()
                .Name("megatrain_daemon_rpcs_total")
                .Help("Finished RPCs by method and gRPC status code")
                .Register(r)) {
  healthy_.Set(1);
}

DaemonMetrics::LayerSeries& DaemonMetrics::Layer(int layer) {
  auto it = layers_.find(layer);
  if (it != layers_.end()) return it->second;
  const prometheus::Labels labels{{"layer", std::to_string(layer)}};
  LayerSeries s{&layer_copy_in_.Add(labels, SecondsBuckets()),
                &layer_compute_.Add(labels, SecondsBuckets()),
                &layer_copy_out_.Add(labels, SecondsBuckets()),
                &layer_stall_.Add(labels, SecondsBuckets()),
                &layer_optimizer_.Add(labels, SecondsBuckets()),
                &layer_overlap_.Add(labels)};
  return layers_.emplace(layer, s).first->second;
}

DaemonMetrics::DeviceSeries& DaemonMetrics::DeviceRank(int rank) {
  auto it = devices_.find(rank);
  if (it != devices_.end()) return it->second;
  const prometheus::Labels labels{{"rank", std::to_string(rank)}};
  DeviceSeries s{&device_stall_.Add(labels, SecondsBuckets()),
                 &device_compute_.Add(labels, SecondsBuckets()), &device_link_bytes_.Add(labels),
                 &device_turn_wait_.Add(labels, SecondsBuckets()),
                 &device_reduce_.Add(labels, SecondsBuckets())};
  return devices_.emplace(rank, s).first->second;
}

void DaemonMetrics::RecordStep(const engine::StepReport& report, double validation_loss) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < report.layers.size(); ++i) {
    const engine::LayerTiming& t = report.layers[i];
    LayerSeries& s = Layer(static_cast<int>(i));
    s.copy_in->Observe(t.copy_in_seconds);
    s.compute->Observe(t.compute_seconds);
    s.copy_out->Observe(t.copy_out_seconds);
    s.stall->Observe(t.stall_seconds);
    s.optimizer->Observe(t.optimizer_seconds);
    s.overlap->Set(t.overlap_ratio());
  }
  for (size_t d = 0; d < report.devices.size(); ++d) {
    const engine::DeviceStepFigures& f = report.devices[d];
    DeviceSeries& s = DeviceRank(static_cast<int>(d));
    s.stall->Observe(f.stall_seconds);
    s.compute->Observe(f.compute_seconds);
    s.link_bytes->Increment(static_cast<double>(f.link_bytes));
    s.turn_wait->Observe(f.turn_wait_seconds);
    s.reduce->Observe(f.reduce_seconds);
  }
  // Whole-step stall also counts waits that are not weight copies, so clamp into [0, 1].
  overlap_ratio_.Set(
      report.total_copy_in_seconds > 0
          ? std::clamp(1.0 - report.total_stall_seconds / report.total_copy_in_seconds, 0.0, 1.0)
          : 1.0);
  tokens_per_second_.Set(report.tokens_per_second);
  loss_.Set(report.loss);
  validation_loss_.Set(validation_loss);
  learning_rate_.Set(report.learning_rate);
  optimizer_seconds_.Observe(report.optimizer_seconds);
  step_seconds_.Observe(report.step_seconds);
  steps_.Increment();
  tokens_.Increment(static_cast<double>(report.tokens));
  nvme_read_bytes_.Increment(static_cast<double>(report.nvme_bytes_read));
  nvme_written_bytes_.Increment(static_cast<double>(report.nvme_bytes_written));
  memory_bytes_.Add({{"tier", "device"}}).Set(static_cast<double>(report.device_arena_bytes));
  memory_bytes_.Add({{"tier", "pinned"}}).Set(static_cast<double>(report.pinned_host_bytes));
  memory_bytes_.Add({{"tier", "ram"}}).Set(static_cast<double>(report.pageable_host_bytes));
  arena_peak_.Set(static_cast<double>(report.device_arena_peak_bytes));
  for (size_t b = 0; b < report.activation_blocks.size(); ++b) {
    for (const char* mode : {"keep", "offload", "recompute"}) {
      prometheus::Gauge& g =
          activation_block_mode_.Add({{"block", std::to_string(b)}, {"mode", mode}});
      if (std::find(block_modes_.begin(), block_modes_.end(), &g) == block_modes_.end()) {
        block_modes_.push_back(&g);
      }
      g.Set(report.activation_blocks[b].mode == mode ? 1 : 0);
    }
  }
}

void DaemonMetrics::EndJob() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [layer, s] : layers_) {
    layer_copy_in_.Remove(s.copy_in);
    layer_compute_.Remove(s.compute);
    layer_copy_out_.Remove(s.copy_out);
    layer_stall_.Remove(s.stall);
    layer_optimizer_.Remove(s.optimizer);
    layer_overlap_.Remove(s.overlap);
  }
  layers_.clear();
  for (const auto& [rank, s] : devices_) {
    device_stall_.Remove(s.stall);
    device_compute_.Remove(s.compute);
    device_link_bytes_.Remove(s.link_bytes);
    device_turn_wait_.Remove(s.turn_wait);
    device_reduce_.Remove(s.reduce);
  }
  devices_.clear();
  for (prometheus::Gauge* g : block_modes_) activation_block_mode_.Remove(g);
  block_modes_.clear();
}

void DaemonMetrics::SetQueueLength(int queued) { queue_length_.Set(queued); }

void DaemonMetrics::SetJobsByState(const std::map<std::string, int>& counts) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [state, count] : counts) {
    prometheus::Gauge*& g = job_states_[state];
    if (g == nullptr) g = &jobs_.Add({{"state", state}});
    g->Set(count);
  }
}

void DaemonMetrics::SetHealthy(bool healthy) { healthy_.Set(healthy ? 1 : 0); }

void DaemonMetrics::CountRpc(const std::string& method, const std::string& code) {
  std::lock_guard<std::mutex> lock(mu_);
  prometheus::Counter*& c = rpc_series_[{method, code}];
  if (c == nullptr) c = &rpcs_.Add({{"method", method}, {"code", code}});
  c->Increment();
}

}  // namespace megatrain::server
