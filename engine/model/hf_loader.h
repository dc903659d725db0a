// LoadHfWeights: fills a ParameterLayout's fp32 entry buffers from a Hugging Face model directory.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/common/input_files.h"
#include "engine/model/parameter_layout.h"
#include "engine/model/safetensors_dtype.h"

namespace megatrain::engine {

// Reads `dir`/model.safetensors, or else the shards named by
// `dir`/model.safetensors.index.json (model-0000N-of-0000M.safetensors), and
// writes every layout tensor, converted exactly to fp32, at its offset in
// entry_buffers[e] (one buffer of layout.entries()[e].num_elements floats per
// entry); alignment padding is set to zero. A null buffer skips its entry:
// its tensors are checked like the others but not read (a caller loading a
// model larger than its RAM goes entry by entry; the tied-head comparison
// runs in the call that reads the embedding).
//
// Refused, with the tensor and file named:
// - a layout tensor that is missing, present twice (in one file or across
//   shards), or whose shape differs (expected and actual shapes are named);
// - a tensor the layout does not have, unless known harmless
//   ("*.rotary_emb.inv_freq", recomputed from rope_theta); for tied models
//   "lm_head.weight" is accepted only if bitwise-equal to the embedding;
// - an index whose weight_map names a missing shard, a path outside `dir`, or
//   disagrees with the shard's contents;
// - a directory whose only weights are pickle files (*.bin, *.pt, *.pth,
//   *.ckpt, *.pkl, *.pickle): "<file>: pickle-based weights are not loaded
//   (they can execute code); convert to safetensors". They are never opened.
// The dtype the directory's weights are stored in (that of its first floating
// tensor in model.safetensors or the first shard of the index): what a
// checkpoint of a model started from it is written in by default.
//
// With `inputs` (a daemon's run) every file is read from the descriptor checked when the job
// started (its key is "<dir>/<name>"); a file that was not checked is refused.
absl::StatusOr<SafetensorsDtype> HfWeightsDtype(const std::string& dir,
                                                const InputFiles* inputs = nullptr);

absl::Status LoadHfWeights(const std::string& dir, const ParameterLayout& layout,
                           absl::Span<float* const> entry_buffers,
                           const InputFiles* inputs = nullptr);

}  // namespace megatrain::engine
