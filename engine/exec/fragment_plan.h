// The static plan of fragmented weight streaming for one op list (a step or
// an evaluation schedule): every op's tensors in consumption order, cut into
// row-block fragments, placed FIFO in a device ring of weight_ring_bytes, and
// for each fragment the earlier fragment whose free event its copy must wait
// for; for each part of each op, the fragments it waits for and the ones it
// frees. Built once at Create; a Run replays it (the ring restarts at offset
// 0 every Run, which synchronises at its end).
//
// Placement: the tensors one part reads together (a matrix and its bias; the
// head's parts read the final norm or one vocabulary block) form a unit laid
// out contiguously; a unit
// that does not fit before the ring's end wraps to offset 0. A fragment's
// copy waits for the free event of the overlapping earlier fragment freed
// last (compute records frees in stream order, so that covers every other
// overlapping one), and Create checks that this free is recorded by a part
// before the first part reading the new fragment: no wait can deadlock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/exec/fragment_parts.h"
#include "engine/exec/model_dims.h"
#include "engine/exec/step_schedule.h"

namespace megatrain::engine {

// One tensor of one op, placed in the ring.
struct PlannedTensor {
  int op = 0;                  // index into the op list
  int entry = 0;               // parameter entry it is read from
  int64_t element_offset = 0;  // inside the entry
  int64_t elements = 0;
  size_t ring_offset = 0;  // bytes from the ring's base (256-byte aligned)
  int first_fragment = 0;
  int fragment_count = 0;
  std::string name;  // e.g. "layer 3 gate", "lm_head rows 0-8191"
};

// One row block of a tensor: one copy, one ready event, one free event.
struct WeightFragment {
  int tensor = 0;              // index into FragmentPlan::tensors
  int64_t element_offset = 0;  // inside the entry
  int64_t elements = 0;
  size_t ring_offset = 0;  // bytes
  // The earlier fragment whose free event the copy waits for; -1 = none.
  int blocker = -1;
  // The first fragment the op copies from this entry: the copy waits for
  // the entry's optimizer update first.
  bool waits_for_update = false;
  int first_reader = 0;  // global part index (FragmentPlan::parts)
  int last_reader = 0;
};

// One part of one op, in enqueue order.
struct PlannedPart {
  int op = 0;
  int part = 0;            // 0..kLayerParts-1 or 0..HeadPartCount-1
  int last_fragment = -1;  // the part waits for fragments up to this one
  std::vector<int> frees;  // fragments whose last reader this part is
};

struct FragmentPlan {
  std::vector<PlannedTensor> tensors;
  std::vector<WeightFragment> fragments;
  std::vector<PlannedPart> parts;
  // Per op: its first part in `parts` and its part count (0 for host stages).
  std::vector<int> first_part;
  std::vector<int> part_count;
  // Per op: ring byte offset of each layer tensor (index TensorRole; absent
  // tensors are SIZE_MAX) — layer ops; head ops: of the unit each part reads.
  std::vector<std::vector<size_t>> ring_offsets;
  size_t largest_unit_bytes = 0;  // the smallest ring the plan can run with
};

struct FragmentPlanInputs {
  ModelDims dims;
  LayerOffsets offsets;
  std::vector<size_t> entry_elements;  // floats of each parameter entry
  size_t element_bytes = 4;            // of the device's weight copy
  size_t ring_bytes = 0;               // weight_ring_bytes
  size_t fragment_bytes = 0;           // largest row block, bytes (> 0)
};

// INVALID_ARGUMENT naming weight_ring_bytes, the tensor(s) and both sizes
// when the ring cannot hold a tensor or what one part reads together.
absl::StatusOr<FragmentPlan> PlanFragments(const std::vector<ScheduledOp>& ops,
                                           const FragmentPlanInputs& in);

// Ring bytes one layer's tensors take (each 256-byte aligned): the ring at
// which a whole layer fits, the budget where double buffering is impossible.
size_t LayerRingBytes(const ModelDims& dims, const LayerOffsets& offsets, size_t element_bytes);

// Fragment size used when ExecutorOptions::fragment_bytes is 0.
inline constexpr size_t kDefaultFragmentBytes = size_t{4} << 20;

}  // namespace megatrain::engine
