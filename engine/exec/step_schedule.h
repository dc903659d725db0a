// The op sequence of one micro-batch's forward + backward under activation
// checkpointing every k layers: which stage runs, in which direction, whether
// it saves activations, and which parameter entries its weights come from.
//
// Schedule for L layers, checkpoint interval k (keep_all = no recompute):
//   1. EmbedForward                      (host entry: embedding — the batch's
//                                         rows are gathered on the host and
//                                         copied in, never the whole table)
//   2. LayerForward i = 0..L-1           (saves full activations only for the
//                                         top block, or every layer if keep_all;
//                                         the input of layer i with i % k == 0
//                                         is kept as a checkpoint)
//   3. Head                              (final norm + LM head + loss + its
//                                         backward, fused; entries: final norm,
//                                         LM head or the tied embedding)
//   4. for each block from the top:      LayerForward (recompute, saving) for the
//                                         block's layers bottom-up — skipped for
//                                         the top block and when keep_all — then
//                                         LayerBackward top-down
//   5. EmbedBackward                     (host entry: embedding — the rows'
//                                         gradients are copied out and
//                                         scatter-added into the host slab)
// Weights stream into two device slots; consecutive ops on the same entries
// reuse the slot instead of copying again.
//
// Block modes (ScheduleShape::block_modes, one per block below the top; the
// top block is always kept in the working sets 0..k-1):
//   kRecompute  as above (the default).
//   kKeep       the first forward saves the block's activations into sets of
//               its own (k + keep ordinal * k + i % k); backward reads them.
//   kOffload    the first forward saves into working set i % k and copy_out
//               copies the set to the host right after; copy_in fetches it
//               back into set i % k as soon as the last earlier op using that
//               set has run (`fetch_after`), ahead of the block's backward.
// Neither kKeep nor kOffload blocks recompute or keep a checkpoint.
#pragma once

#include <string>
#include <vector>

namespace megatrain::engine {

enum class StageKind { kEmbedForward, kLayerForward, kHead, kLayerBackward, kEmbedBackward };

// How a block's activations reach its backward (see above).
enum class ActivationMode { kRecompute, kKeep, kOffload };

// "recompute", "keep", "offload".
const char* ActivationModeName(ActivationMode mode);

// A saved-activation set copy_in brings back from the host.
struct ActivationFetch {
  int layer = -1;  // whose offloaded set
  int set = -1;    // the working set it lands in
  bool operator==(const ActivationFetch&) const = default;
};

struct ScheduledOp {
  StageKind kind;
  int layer = -1;                 // for layer stages
  bool save_activations = false;  // LayerForward: keep what backward needs
  bool recompute = false;         // LayerForward in the backward phase
  int activation_set = -1;        // which saved-activation set the op writes/reads
  int checkpoint = -1;            // LayerForward: checkpoint index whose input it keeps (or -1)
  std::vector<int> entries;       // parameter-layout entries whose weights the op reads
  bool produces_gradients = false;
  bool loss_only = false;  // Head in evaluation: loss without gradients
  // Embedding stages: the entry is read (forward) or receives its gradient
  // (backward) on the host, row by row; `entries` is then empty (no slot).
  // Last member: ops are aggregate-initialised positionally.
  int host_entry = -1;
  // LayerForward of an offloaded layer: copy the saved set to the host after it.
  bool offload_activations = false;
  // LayerBackward: its set is fetched from the host (wait for the fetch).
  bool fetched_activations = false;
  // Fetches copy_in may start once this op is done with their set.
  std::vector<ActivationFetch> fetch_after = {};
};

struct ScheduleShape {
  int num_layers = 0;
  int checkpoint_interval = 4;  // k >= 1
  bool keep_all = false;        // keep every activation, recompute nothing
  int embedding_entry = 0;
  int first_layer_entry = 1;
  int final_norm_entry = 0;
  int lm_head_entry = 0;  // == embedding_entry when tied
  // One per block (ceil(L / k)), the top block's ignored; empty = all
  // kRecompute. Ignored with keep_all.
  std::vector<ActivationMode> block_modes;
};

int BlockCount(const ScheduleShape& shape);
// The mode of block b under the shape (kKeep for the top block).
ActivationMode BlockMode(const ScheduleShape& shape, int block);
// Blocks below the top with the given mode.
int BlocksWithMode(const ScheduleShape& shape, ActivationMode mode);

// Number of activation sets the device needs: k working sets (the top block,
// each recomputed or offloaded block) + k per kept block, or L with keep_all.
int ActivationSetCount(const ScheduleShape& shape);
// Number of checkpoints (inputs of layers 0, k, 2k, ... below the top block,
// which keeps its activations and needs none); 0 with keep_all. Indexed by
// block whatever the modes (kept and offloaded blocks leave theirs unused), so
// modes can change without reallocating.
int CheckpointCount(const ScheduleShape& shape);

std::vector<ScheduledOp> BuildStepSchedule(const ScheduleShape& shape);

// Forward only, for evaluation: embedding, every layer (saving nothing), and
// the head computing the loss alone.
std::vector<ScheduledOp> BuildEvalSchedule(const ScheduleShape& shape);

std::string DescribeOp(const ScheduledOp& op);

}  // namespace megatrain::engine
