// The data-parallel model (protocol in data_parallel.h).
#include "engine/planner/data_parallel.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace megatrain::engine::planner {
namespace {

// Bytes AdamW moves per parameter on the host (master, m, v read and written, gradient read)
// and the gradient-norm pass's read: the step model's own figures (docs/planning.md).
constexpr double kAdamwHostBytesPerParam = 28;
constexpr double kGradNormBytesPerParam = 4;
constexpr double kAccumulateBytesPerElement = 12;

double Seconds(double bytes, double gbps) { return bytes > 0 ? bytes / (gbps * 1e9) : 0; }

absl::Status CheckShape(const HardwareProfile& hw, const DataParallelShape& shape) {
  if (shape.devices_per_node < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("devices=", shape.devices_per_node, " must be >= 1"));
  }
  if (shape.nodes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("nodes=", shape.nodes, " must be >= 1"));
  }
  if (shape.devices_per_node > 1 && !(hw.peer_gbps > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("hardware profile '", hw.name,
                                                   "' gives no peer_gbps (device to device "
                                                   "GB/s): cannot predict devices=",
                                                   shape.devices_per_node));
  }
  if (shape.nodes > 1 && !(hw.network_gbps > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("hardware profile '", hw.name,
                                                   "' gives no network_gbps (node to node "
                                                   "GB/s): cannot predict nodes=",
                                                   shape.nodes));
  }
  return absl::OkStatus();
}

// How a node's devices combine their gradients: ReduceOnDevices' auto rule on a GPU, from the
// accumulation the run asked for. With an untied embedding, gradients in RAM and no request for
// host sums: a reduce-scatter of each device's whole sums once a step where they fit beside the
// minimum plan (every device keeps them, even over one micro-batch); else, where 1/n of them and
// a shard buffer fit (and no weight ring), a reduce-scatter of every micro-batch into shard sums.
// Otherwise the devices take turns on the host's slabs.
WithinNode WithinNodeOf(const PlanResult& one, const HardwareProfile& hw, double n) {
  if (hw.cpu_device || one.tied_embeddings ||
      one.asked_gradient_accumulation == GradientAccumulation::kHost ||
      one.placement.tier(tiers::BufferKind::kGrad) == tiers::Tier::kNvme) {
    return WithinNode::kHostTurns;
  }
  // The sums (every parameter's, a slight overcount: the embedding's is not summed), beside the
  // minimum plan (two weight slots, the checkpoints on the host), with 1/16 left to
  // fragmentation: the executor's auto rule (ResolveGradientAccumulation).
  double largest = 0;
  for (double e : one.work.entry_elements) largest = std::max(largest, e);
  const double whole = static_cast<double>(one.padded_elements) * 4;
  const double shards = (static_cast<double>(one.padded_elements) + largest) / n * 4;
  const double capacity = static_cast<double>(one.device_arena_capacity);
  const DeviceMemoryPlan& d = one.device;
  const double slots =
      d.weight_ring || one.weight_slots <= 2
          ? static_cast<double>(d.weight_slots)
          : static_cast<double>(d.weight_slots) * 2 / static_cast<double>(one.weight_slots);
  const double minimum = slots + static_cast<double>(d.gradient_buffers + d.activations + d.scratch);
  const auto fits = [&](double sums) { return minimum + sums + capacity / 16 <= capacity; };
  if (fits(whole)) return WithinNode::kReduceScatter;
  if (fits(shards) && one.executor.weight_ring_bytes == 0) return WithinNode::kShardSums;
  return WithinNode::kHostTurns;
}

DataParallelPrediction Predict(const PlanResult& one, const HardwareProfile& hw,
                               const DataParallelShape& shape) {
  const double n = shape.devices_per_node;
  const double m = shape.nodes;
  DataParallelPrediction p;
  p.shape = shape;
  p.within_node = n > 1 ? WithinNodeOf(one, hw, n) : WithinNode::kReduceScatter;
  p.reduce_scatter = p.within_node != WithinNode::kHostTurns;
  // Shard sums: only the ops of the step's last micro-batch copy their shards out.
  const size_t first_of_last_micro_batch =
      one.work.ops.size() - one.work.ops.size() / static_cast<size_t>(
                                                      std::max(1, one.work.micro_batches));

  // The per-device work: 1/N of every reducible gradient leaves over the link (and reaches the
  // host add and the NVMe gradients); the node's share of the optimizer is 1/M.
  StepWork w = one.work;
  // Across nodes the trainer runs under a communicator, which turns the speculative update off.
  if (m > 1) w.speculative_update = false;
  double aggregate_nvme_read = 0, aggregate_nvme_written = 0;
  for (size_t i = 0; i < w.ops.size(); ++i) {
    OpWork& o = w.ops[i];
    // Turns: each device copies out its whole gradient and the host adds every device's.
    if (o.gradient_bytes > 0 && n > 1 && p.reduce_scatter) {
      const double sent = o.gradient_bytes * (n - 1) / n;
      p.reduce_bytes_per_device += sent;
      o.reduce_seconds = Seconds(sent, hw.peer_gbps);
      p.reduce_seconds += o.reduce_seconds;
      if (p.within_node == WithinNode::kShardSums) {
        // The shard is added to its sum on the device; the last micro-batch copies it out.
        o.copy_out_bytes -= i >= first_of_last_micro_batch ? sent : o.gradient_bytes;
        o.accumulate_elements = 0;
      } else {
        o.copy_out_bytes -= sent;
        o.accumulate_elements /= n;
      }
      o.nvme_read_bytes /= n;
      o.nvme_write_bytes /= n;
    }
    // The node's drives serve every device: 1/N of the gradients each, whole weight copies each.
    aggregate_nvme_read += o.nvme_read_bytes * n + o.nvme_weight_bytes * n;
    aggregate_nvme_written += o.nvme_write_bytes * n;
    p.link_in_bytes_per_device += o.copy_in_bytes;
    p.link_out_bytes_per_device += o.copy_out_bytes;
  }
  double parameters = 0;
  for (double& e : w.entry_elements) {
    parameters += e;
    // The updated compute copy of the entry comes back from its owner node before its copy-in.
    if (m > 1) {
      w.entry_gather_seconds.push_back(Seconds(e * (m - 1) / m * hw.weight_bytes, hw.network_gbps));
    }
    e /= m;
  }
  w.optimizer_elements /= m;
  NvmeEntryIo io = one.nvme_io;
  for (double& b : io.optimizer_read) {
    b /= m;
    aggregate_nvme_read += b;
  }
  for (double& b : io.optimizer_written) {
    b /= m;
    aggregate_nvme_written += b;
  }

  const StepTimeEstimate t = EstimateStepTime(w, hw, io);
  p.pipeline_seconds = t.step_seconds;
  p.compute_seconds = t.compute_seconds;
  p.copy_in_seconds = t.copy_in_seconds;
  p.copy_out_seconds = t.copy_out_seconds - p.reduce_seconds;
  p.optimizer_seconds = t.optimizer_seconds + t.grad_norm_seconds;

  // Host memory: every device's copies in and out and host adds, the optimizer pass of the
  // node's share, and every NVMe byte (staged through host memory once).
  double accumulate = 0;
  for (const OpWork& o : w.ops) accumulate += o.accumulate_elements;
  p.host_memory_bytes_per_node =
      n * (p.link_in_bytes_per_device + p.link_out_bytes_per_device +
           accumulate * kAccumulateBytesPerElement) +
      parameters / m * (kAdamwHostBytesPerParam + kGradNormBytesPerParam) + aggregate_nvme_read +
      aggregate_nvme_written;
  p.host_memory_seconds = Seconds(p.host_memory_bytes_per_node, hw.host_memory_gbps);
  p.nvme_seconds =
      (aggregate_nvme_read > 0 ? Seconds(aggregate_nvme_read, hw.nvme_read_gbps) : 0) +
      (aggregate_nvme_written > 0 ? Seconds(aggregate_nvme_written, hw.nvme_write_gbps) : 0);
  if (m > 1) {
    // Ring reduce-scatter of the fp32 gradients (beside the last micro-batch's backward), ring
    // all-gather of the updated compute copy (in the optimizer chain, entry_gather_seconds).
    p.network_bytes_per_node = parameters * (m - 1) / m * (hw.grad_bytes + hw.weight_bytes);
    p.network_seconds = Seconds(p.network_bytes_per_node, hw.network_gbps);
  }
  p.step_seconds =
      std::max({p.pipeline_seconds, p.host_memory_seconds, p.nvme_seconds, p.network_seconds});

  const std::pair<const char*, double> busy[] = {
      {"compute", p.compute_seconds},
      {"copy-in", p.copy_in_seconds},
      {"copy-out", p.copy_out_seconds},
      {"peer reduction", p.reduce_seconds},
      {"host memory", p.host_memory_seconds},
      {"host optimizer", p.optimizer_seconds},
      {"nvme", p.nvme_seconds},
      {"network", p.network_seconds},
  };
  double most = -1;
  for (const auto& [name, seconds] : busy) {
    if (seconds > most) {
      most = seconds;
      p.bottleneck = name;
    }
  }
  p.tokens_per_step = one.work.tokens * shape.devices();
  p.tokens_per_second = p.tokens_per_step / p.step_seconds;
  p.model_tflops = one.work.model_flops * shape.devices() / p.step_seconds / 1e12;
  return p;
}

}  // namespace

absl::StatusOr<DataParallelPrediction> PredictDataParallel(const PlanResult& one_device,
                                                           const HardwareProfile& hw,
                                                           const DataParallelShape& shape) {
  if (absl::Status s = CheckShape(hw, shape); !s.ok()) return s;
  DataParallelPrediction p = Predict(one_device, hw, shape);
  const DataParallelPrediction alone = Predict(one_device, hw, DataParallelShape{});
  p.efficiency = p.tokens_per_second / (shape.devices() * alone.tokens_per_second);
  return p;
}

std::vector<DataParallelShape> DefaultScalingShapes(const HardwareProfile& hw) {
  std::vector<DataParallelShape> shapes = {{1, 1}};
  if (hw.peer_gbps > 0) {
    for (int n : {2, 4, 8}) shapes.push_back({n, 1});
    if (hw.network_gbps > 0) {
      for (int m : {2, 4}) shapes.push_back({8, m});
    }
  }
  return shapes;
}

absl::StatusOr<std::vector<DataParallelPrediction>> PredictScaling(
    const PlanResult& one_device, const HardwareProfile& hw,
    const std::vector<DataParallelShape>& shapes) {
  std::vector<DataParallelPrediction> rows;
  for (const DataParallelShape& shape : shapes) {
    absl::StatusOr<DataParallelPrediction> p = PredictDataParallel(one_device, hw, shape);
    if (!p.ok()) return p.status();
    rows.push_back(*std::move(p));
  }
  return rows;
}

const char* WithinNodeName(const DataParallelPrediction& p) {
  if (p.shape.devices_per_node <= 1) return "-";
  switch (p.within_node) {
    case WithinNode::kReduceScatter:
      return "reduce-scatter";
    case WithinNode::kShardSums:
      return "shard sums";
    case WithinNode::kHostTurns:
      return "host turns";
  }
  return "?";
}

std::string ScalingTable(const std::vector<DataParallelPrediction>& rows) {
  std::string out = absl::StrCat(
      "data parallel (per device: the micro-batch and accumulation above; within a node (last "
      "column): a reduce-scatter of each device's sums once a step, of every micro-batch into "
      "sums of its shards where the whole sums do not fit, or host turns where neither can run "
      "(tied embedding, gradients on NVMe, host sums asked for); ZeRO-1 across nodes)\n",
      "devices nodes  tokens/step     step s    tokens/s  model TFLOP/s  efficiency  "
      "bottleneck      link in/out GB  reduce GB  host mem GB  network GB  within node\n");
  for (const DataParallelPrediction& p : rows) {
    absl::StrAppend(
        &out, absl::StrFormat("%7d %5d %12.0f %10.3f %11.0f %14.1f %10.3f  %-15s %7.1f/%-7.1f "
                              "%9.1f %12.1f %11.1f  %s\n",
                              p.shape.devices(), p.shape.nodes, p.tokens_per_step, p.step_seconds,
                              p.tokens_per_second, p.model_tflops, p.efficiency, p.bottleneck,
                              p.link_in_bytes_per_device / 1e9, p.link_out_bytes_per_device / 1e9,
                              p.reduce_bytes_per_device / 1e9, p.host_memory_bytes_per_node / 1e9,
                              p.network_bytes_per_node / 1e9, WithinNodeName(p)));
  }
  return out;
}

std::string ScalingJson(const std::vector<DataParallelPrediction>& rows) {
  nlohmann::json j = nlohmann::json::array();
  for (const DataParallelPrediction& p : rows) {
    j.push_back({{"devices", p.shape.devices()},
                 {"within_node", WithinNodeName(p)},
                 {"devices_per_node", p.shape.devices_per_node},
                 {"nodes", p.shape.nodes},
                 {"tokens_per_step", p.tokens_per_step},
                 {"step_seconds", p.step_seconds},
                 {"tokens_per_second", p.tokens_per_second},
                 {"model_tflops", p.model_tflops},
                 {"efficiency", p.efficiency},
                 {"bottleneck", p.bottleneck},
                 {"link_in_bytes_per_device", p.link_in_bytes_per_device},
                 {"link_out_bytes_per_device", p.link_out_bytes_per_device},
                 {"reduce_bytes_per_device", p.reduce_bytes_per_device},
                 {"host_memory_bytes_per_node", p.host_memory_bytes_per_node},
                 {"network_bytes_per_node", p.network_bytes_per_node},
                 {"busy_seconds",
                  {{"pipeline", p.pipeline_seconds},
                   {"compute", p.compute_seconds},
                   {"copy_in", p.copy_in_seconds},
                   {"copy_out", p.copy_out_seconds},
                   {"peer_reduction", p.reduce_seconds},
                   {"host_memory", p.host_memory_seconds},
                   {"host_optimizer", p.optimizer_seconds},
                   {"nvme", p.nvme_seconds},
                   {"network", p.network_seconds}}}});
  }
  return j.dump(2);
}

}  // namespace megatrain::engine::planner
