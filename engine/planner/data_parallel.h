// Data-parallel prediction on top of the one-device step model: N devices per node, M nodes,
// every device streaming the same layers over its own host link (docs/planning.md "Data
// parallelism"; the protocol is docs/scale_out.md's).
//
// In a node the devices reduce-scatter each op's gradients (NCCL over the profile's peer link)
// before its copy-out, so each device copies out 1/N of them and the host adds 1/N; the node's
// host holds one copy of the state and runs one optimizer pass (its compute copy is what every
// device copies in). Across nodes the state is sharded (ZeRO-1): each node updates 1/M of the
// parameters after a network reduce-scatter of the accumulated gradients, then the updated
// compute copy is all-gathered over the network, entry by entry, before the entry's next copy-in.
//
// Step time = max(the per-device pipeline replay with those changes, the busy time of each
// resource the devices share: host memory, NVMe, network). The shared resources are assumed to
// overlap the pipeline perfectly (the one-device model's overlap), so this is a lower bound.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/planner/hardware_profile.h"
#include "engine/planner/planner.h"

namespace megatrain::engine::planner {

struct DataParallelShape {
  int devices_per_node = 1;
  int nodes = 1;
  int devices() const { return devices_per_node * nodes; }
};

// How a node's devices combine their gradients (the trainer's gradient_reduction auto on GPUs).
enum class WithinNode {
  kReduceScatter,  // devices: each device's sums reduce-scattered once a step
  kShardSums,      // device_shards: every micro-batch reduce-scattered into 1/N sums
  kHostTurns,      // host: every device's whole gradients added on the host in turns
};

struct DataParallelPrediction {
  DataParallelShape shape;
  WithinNode within_node = WithinNode::kReduceScatter;
  bool reduce_scatter = true;  // within_node is not kHostTurns
  // Bytes per optimizer step.
  double link_in_bytes_per_device = 0;    // host to device: weights, checkpoints, activations
  double link_out_bytes_per_device = 0;   // device to host: 1/N of the gradients, checkpoints
  double reduce_bytes_per_device = 0;     // sent to the node's peers: (N-1)/N of the gradients
  double host_memory_bytes_per_node = 0;  // every device's copies + host adds + optimizer pass
  double network_bytes_per_node = 0;      // sent: (M-1)/M of the gradients and the compute copy
  // Busy seconds per step of each resource (device ones per device, shared ones per node).
  double compute_seconds = 0;
  double copy_in_seconds = 0;
  double copy_out_seconds = 0;  // without the reduction
  double reduce_seconds = 0;
  double host_memory_seconds = 0;
  double optimizer_seconds = 0;  // AdamW of the node's share + gradient norm
  double nvme_seconds = 0;       // the node's drives
  double network_seconds = 0;
  double pipeline_seconds = 0;  // the per-device replay (one-device step model)
  double step_seconds = 0;
  std::string bottleneck;      // compute, copy-in, copy-out, peer reduction, host memory,
                               // host optimizer, nvme, network
  double tokens_per_step = 0;  // global: devices x micro-batch x seq x accumulation
  double tokens_per_second = 0;
  double model_tflops = 0;  // all devices together
  double efficiency = 0;    // tokens/s / (devices x tokens/s of one device)
};

// `one_device` is Plan()'s result for the per-device micro-batch and accumulation. Refuses a
// shape below 1 device or node, and more than one device per node (node) when the profile has
// no peer_gbps (network_gbps), naming the field.
absl::StatusOr<DataParallelPrediction> PredictDataParallel(const PlanResult& one_device,
                                                           const HardwareProfile& hw,
                                                           const DataParallelShape& shape);

// 1, 2, 4, 8 devices in one node, then 2 and 4 nodes of 8 (where the profile has the figures).
std::vector<DataParallelShape> DefaultScalingShapes(const HardwareProfile& hw);

absl::StatusOr<std::vector<DataParallelPrediction>> PredictScaling(
    const PlanResult& one_device, const HardwareProfile& hw,
    const std::vector<DataParallelShape>& shapes);

// One row per prediction: devices, nodes, global tokens/step, step s, tokens/s, model TFLOP/s,
// efficiency, bottleneck, and the bytes per step over each link.
// "reduce-scatter", "shard sums" or "host turns" ("-" with one device per node).
const char* WithinNodeName(const DataParallelPrediction& p);
std::string ScalingTable(const std::vector<DataParallelPrediction>& rows);
std::string ScalingJson(const std::vector<DataParallelPrediction>& rows);

}  // namespace megatrain::engine::planner
