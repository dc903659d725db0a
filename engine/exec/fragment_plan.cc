// FragmentPlan: consumption order, row blocks, ring placement and blockers.
#include "engine/exec/fragment_plan.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace megatrain::engine {
namespace {

size_t Round256(size_t bytes) { return (bytes + 255) / 256 * 256; }

struct TensorSpec {
  int entry = 0;
  int64_t element_offset = 0;
  int64_t elements = 0;
  int64_t row_elements = 0;
  int layer_slot = 0;  // TensorRole index, or the head part reading it
  std::string name;
};

// An op's tensors as placement units (read together by one part) and its
// parts as the units they read.
struct OpTensors {
  std::vector<std::vector<TensorSpec>> units;
  std::vector<std::vector<int>> part_units;  // per part: indices into units
};

OpTensors DescribeOpTensors(const ScheduledOp& op, const FragmentPlanInputs& in) {
  OpTensors t;
  if (op.kind == StageKind::kLayerForward || op.kind == StageKind::kLayerBackward) {
    const int entry = op.entries[0];
    for (int p = 0; p < kLayerParts; ++p) {
      const TensorRole main =
          op.kind == StageKind::kLayerForward ? ForwardPartTensor(p) : BackwardPartTensor(p);
      std::vector<TensorSpec> unit;
      for (TensorRole lt : {main, BiasOf(main), HeadNormOf(main)}) {
        // No bias or norm: BiasOf / HeadNormOf returned the matrix itself.
        if (!unit.empty() && lt == main) continue;
        const int64_t offset = OffsetOf(in.offsets, lt);
        if (offset < 0) continue;
        const TensorExtent extent = ExtentOf(in.dims, lt);
        unit.push_back({entry, offset, extent.elements, extent.row_elements, static_cast<int>(lt),
                        absl::StrCat("layer ", op.layer, " ", LayerTensorName(lt))});
      }
      t.units.push_back(std::move(unit));
      t.part_units.push_back({p});
    }
    return t;
  }
  // Head: part p reads unit p alone (fragment_parts.h HeadStepAt): the final
  // norm, each vocabulary block's rows, for training each block's rows again
  // and the final norm again. A re-read is a copy of its own, so the ring
  // never has to hold more than one block.
  const int64_t d = in.dims.hidden;
  const int fn = op.entries[0];
  const int lm = op.entries[1];
  const bool training = op.produces_gradients;
  const int parts = HeadPartCount(in.dims, training);
  for (int p = 0; p < parts; ++p) {
    const HeadStep step = HeadStepAt(in.dims, p);
    if (step.kind == HeadStepKind::kNorm || step.kind == HeadStepKind::kNormBackward) {
      t.units.push_back({{fn, 0, static_cast<int64_t>(in.entry_elements[fn]), d, p, "final_norm"}});
    } else {
      const HeadBlock block = HeadBlockAt(in.dims, step.block);
      t.units.push_back({{lm, block.first_row * d, block.rows * d, d, p,
                          absl::StrCat("lm_head rows ", block.first_row, "-",
                                       block.first_row + block.rows - 1,
                                       step.kind == HeadStepKind::kBackwardBlock ? " (backward)"
                                                                                 : "")}});
    }
    t.part_units.push_back({p});
  }
  return t;
}

// The overlapping earlier fragment freed last, walking back until [a, b) is
// covered by later fragments (an older fragment under a covered byte was
// overwritten by one that already waited for it, and is freed earlier).
int FindBlocker(const std::vector<WeightFragment>& fragments, int f, size_t element_bytes) {
  const size_t a = fragments[f].ring_offset;
  const size_t b = a + static_cast<size_t>(fragments[f].elements) * element_bytes;
  std::vector<std::pair<size_t, size_t>> covered;
  int blocker = -1;
  for (int g = f - 1; g >= 0; --g) {
    const size_t ga = fragments[g].ring_offset;
    const size_t gb = ga + static_cast<size_t>(fragments[g].elements) * element_bytes;
    if (gb <= a || ga >= b) continue;
    if (blocker < 0 || fragments[g].last_reader > fragments[blocker].last_reader) blocker = g;
    covered.emplace_back(std::max(a, ga), std::min(b, gb));
    std::sort(covered.begin(), covered.end());
    size_t reach = a;
    for (const auto& [lo, hi] : covered) {
      if (lo > reach) break;
      reach = std::max(reach, hi);
    }
    if (reach >= b) break;
  }
  return blocker;
}

}  // namespace

size_t LayerRingBytes(const ModelDims& dims, const LayerOffsets& offsets, size_t element_bytes) {
  size_t bytes = 0;
  for (int i = 0; i < kLayerTensorCount; ++i) {
    if (OffsetOf(offsets, LayerTensorAt(i)) < 0) continue;
    bytes +=
        Round256(static_cast<size_t>(ExtentOf(dims, LayerTensorAt(i)).elements) * element_bytes);
  }
  return bytes;
}

absl::StatusOr<FragmentPlan> PlanFragments(const std::vector<ScheduledOp>& ops,
                                           const FragmentPlanInputs& in) {
  if (in.fragment_bytes == 0) {
    return absl::InvalidArgumentError("fragment_bytes must be > 0");
  }
  const size_t eb = in.element_bytes;
  FragmentPlan plan;
  plan.first_part.assign(ops.size(), 0);
  plan.part_count.assign(ops.size(), 0);
  plan.ring_offsets.assign(ops.size(), {});
  size_t cursor = 0;
  for (size_t oi = 0; oi < ops.size(); ++oi) {
    const ScheduledOp& op = ops[oi];
    plan.first_part[oi] = static_cast<int>(plan.parts.size());
    if (op.entries.empty()) continue;
    const bool head = op.kind == StageKind::kHead;
    const OpTensors described = DescribeOpTensors(op, in);
    const int part_count = static_cast<int>(described.part_units.size());
    plan.part_count[oi] = part_count;
    const int first_part = static_cast<int>(plan.parts.size());
    for (int p = 0; p < part_count; ++p) plan.parts.push_back({static_cast<int>(oi), p, -1, {}});
    plan.ring_offsets[oi].assign(head ? part_count : kLayerTensorCount, SIZE_MAX);
    std::vector<int> seen_entries;
    const int op_first_fragment = static_cast<int>(plan.fragments.size());

    for (size_t u = 0; u < described.units.size(); ++u) {
      const std::vector<TensorSpec>& unit = described.units[u];
      size_t unit_bytes = 0;
      std::vector<std::string> names;
      for (const TensorSpec& t : unit) {
        const size_t bytes = static_cast<size_t>(t.elements) * eb;
        if (bytes > in.ring_bytes) {
          return absl::InvalidArgumentError(
              absl::StrCat("weight_ring_bytes=", in.ring_bytes, " is smaller than tensor '", t.name,
                           "' (", bytes,
                           " bytes): the ring must hold the largest tensor or LM-head vocabulary "
                           "block"));
        }
        unit_bytes += Round256(bytes);
        names.push_back(absl::StrCat("'", t.name, "'"));
      }
      if (unit_bytes > in.ring_bytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "weight_ring_bytes=", in.ring_bytes, " cannot hold ", absl::StrJoin(names, " + "), " (",
            unit_bytes, " bytes with alignment), which one part reads together"));
      }
      plan.largest_unit_bytes = std::max(plan.largest_unit_bytes, unit_bytes);
      if (cursor + unit_bytes > in.ring_bytes) cursor = 0;
      // Parts reading this unit.
      int first_reader = -1, last_reader = -1;
      for (int p = 0; p < part_count; ++p) {
        const auto& pu = described.part_units[p];
        if (std::find(pu.begin(), pu.end(), static_cast<int>(u)) == pu.end()) continue;
        if (first_reader < 0) first_reader = first_part + p;
        last_reader = first_part + p;
      }
      for (size_t ti = 0; ti < unit.size(); ++ti) {
        const TensorSpec& t = unit[ti];
        PlannedTensor pt;
        pt.op = static_cast<int>(oi);
        pt.entry = t.entry;
        pt.element_offset = t.element_offset;
        pt.elements = t.elements;
        pt.ring_offset = cursor;
        pt.first_fragment = static_cast<int>(plan.fragments.size());
        pt.name = t.name;
        plan.ring_offsets[oi][t.layer_slot] = cursor;
        const int tensor_first_reader = first_reader;
        const int64_t row_bytes = t.row_elements * static_cast<int64_t>(eb);
        const int64_t rows =
            std::max<int64_t>(1, static_cast<int64_t>(in.fragment_bytes) / row_bytes);
        const int64_t block = rows * t.row_elements;
        for (int64_t first = 0; first < t.elements; first += block) {
          WeightFragment f;
          f.tensor = static_cast<int>(plan.tensors.size());
          f.element_offset = t.element_offset + first;
          f.elements = std::min(block, t.elements - first);
          f.ring_offset = cursor + static_cast<size_t>(first) * eb;
          f.first_reader = tensor_first_reader;
          f.last_reader = last_reader;
          if (std::find(seen_entries.begin(), seen_entries.end(), t.entry) == seen_entries.end()) {
            f.waits_for_update = true;
            seen_entries.push_back(t.entry);
          }
          plan.fragments.push_back(f);
          const int fi = static_cast<int>(plan.fragments.size()) - 1;
          plan.fragments[fi].blocker = FindBlocker(plan.fragments, fi, eb);
          const int blocker = plan.fragments[fi].blocker;
          if (blocker >= 0 && plan.fragments[blocker].last_reader >= f.first_reader) {
            return absl::InternalError(absl::StrCat(
                "fragment plan: '", t.name, "' would wait for a fragment of '",
                plan.tensors[plan.fragments[blocker].tensor].name, "' freed after it is read"));
          }
          ++pt.fragment_count;
        }
        cursor += Round256(static_cast<size_t>(t.elements) * eb);
        plan.tensors.push_back(std::move(pt));
      }
    }
    // Per part: the last fragment to wait for and the fragments it frees.
    for (int fi = op_first_fragment; fi < static_cast<int>(plan.fragments.size()); ++fi) {
      const WeightFragment& f = plan.fragments[fi];
      for (int gp = f.first_reader; gp <= f.last_reader; ++gp) {
        plan.parts[gp].last_fragment = std::max(plan.parts[gp].last_fragment, fi);
      }
      plan.parts[f.last_reader].frees.push_back(fi);
    }
  }
  return plan;
}

}  // namespace megatrain::engine
