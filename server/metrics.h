// DaemonMetrics: every Prometheus metric megatraind exports, declared here once with help text
// and registered on a registry that is passed in. Names: megatrain_<component>_<name>_<unit>.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/train/step_report.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace megatrain::server {

class DaemonMetrics {
 public:
  explicit DaemonMetrics(prometheus::Registry& registry);

  // One optimizer step of the running job.
  void RecordStep(const engine::StepReport& report, double validation_loss);
  // The running job ended: its per-layer, per-device and per-block label sets are removed, so a
  // daemon that runs many jobs of different shapes does not export (and keep) every shape's
  // series.
  void EndJob();
  void SetQueueLength(int queued);
  // Jobs per state name (all states present, zeros included).
  void SetJobsByState(const std::map<std::string, int>& counts);
  void SetHealthy(bool healthy);
  void CountRpc(const std::string& method, const std::string& code);

 private:
  struct LayerSeries {
    prometheus::Histogram* copy_in;
    prometheus::Histogram* compute;
    prometheus::Histogram* copy_out;
    prometheus::Histogram* stall;
    prometheus::Histogram* optimizer;
    prometheus::Gauge* overlap;
  };
  LayerSeries& Layer(int layer);
  // Per device of the job (several devices in one process), labelled rank = device index.
  struct DeviceSeries {
    prometheus::Histogram* stall;
    prometheus::Histogram* compute;
    prometheus::Counter* link_bytes;
    prometheus::Histogram* turn_wait;
    prometheus::Histogram* reduce;
  };
  DeviceSeries& DeviceRank(int rank);

  std::mutex mu_;  // guards the lazily added label sets
  prometheus::Family<prometheus::Histogram>& layer_copy_in_;
  prometheus::Family<prometheus::Histogram>& layer_compute_;
  prometheus::Family<prometheus::Histogram>& layer_copy_out_;
  prometheus::Family<prometheus::Histogram>& layer_stall_;
  prometheus::Family<prometheus::Histogram>& layer_optimizer_;
  prometheus::Family<prometheus::Gauge>& layer_overlap_;
  prometheus::Family<prometheus::Histogram>& device_stall_;
  prometheus::Family<prometheus::Histogram>& device_compute_;
  prometheus::Family<prometheus::Counter>& device_link_bytes_;
  prometheus::Family<prometheus::Histogram>& device_turn_wait_;
  prometheus::Family<prometheus::Histogram>& device_reduce_;
  prometheus::Gauge& overlap_ratio_;
  prometheus::Gauge& tokens_per_second_;
  prometheus::Gauge& loss_;
  prometheus::Gauge& validation_loss_;
  prometheus::Gauge& learning_rate_;
  prometheus::Histogram& optimizer_seconds_;
  prometheus::Histogram& step_seconds_;
  prometheus::Counter& steps_;
  prometheus::Counter& tokens_;
  prometheus::Counter& nvme_read_bytes_;
  prometheus::Counter& nvme_written_bytes_;
  prometheus::Family<prometheus::Gauge>& memory_bytes_;
  prometheus::Gauge& arena_peak_;
  prometheus::Family<prometheus::Gauge>& activation_block_mode_;
  prometheus::Gauge& queue_length_;
  prometheus::Family<prometheus::Gauge>& jobs_;
  prometheus::Gauge& healthy_;
  prometheus::Family<prometheus::Counter>& rpcs_;
  std::map<int, LayerSeries> layers_;
  std::map<int, DeviceSeries> devices_;
  std::vector<prometheus::Gauge*> block_modes_;  // activation_block_mode_ label sets
  std::map<std::string, prometheus::Gauge*> job_states_;
  std::map<std::pair<std::string, std::string>, prometheus::Counter*> rpc_series_;
};

}  // namespace megatrain::server
