// Sizes of one micro-batch through the model, derived once from the config:
// token counts, head geometry and the packed offsets of each layer tensor.
#pragma once

#include <cstdint>

namespace megatrain::engine {

// Element offsets of a layer's tensors inside its packed entry buffer; -1 when
// the tensor does not exist (e.g. biases of Llama without attention_bias).
struct LayerOffsets {
  int64_t input_norm = -1;
  int64_t q = -1, q_bias = -1, q_norm = -1;
  int64_t k = -1, k_bias = -1, k_norm = -1;
  int64_t v = -1, v_bias = -1;
  int64_t o = -1, o_bias = -1;
  int64_t post_norm = -1;
  int64_t gate = -1, gate_bias = -1;
  int64_t up = -1, up_bias = -1;
  int64_t down = -1, down_bias = -1;
};

struct ModelDims {
  int64_t vocab = 0;
  int64_t hidden = 0;    // d
  int64_t ffn = 0;       // F
  int64_t q_heads = 0;   // Hq
  int64_t kv_heads = 0;  // Hkv
  int64_t head_dim = 0;  // D
  int64_t num_layers = 0;
  float rms_eps = 1e-5f;
  int64_t sliding_window = 0;  // 0 = none
  bool tied_embeddings = false;
  // qwen3: q and k are RMS-normalised per head (weights q_norm / k_norm)
  // between the projection and RoPE; the activations keep the projections.
  bool qk_norm = false;

  int64_t batch = 0;                              // sequences per micro-batch (B)
  int64_t seq = 0;                                // S
  int64_t tokens() const { return batch * seq; }  // N
  int64_t q_width() const { return q_heads * head_dim; }
  int64_t kv_width() const { return kv_heads * head_dim; }

  // Token chunk of the fused LM head + cross-entropy; fixed by the model and
  // batch (never by a memory budget) so results are reproducible.
  int64_t head_chunk = 0;
  // Rows of the LM head per vocabulary block (the last block may be shorter):
  // the head streams, computes its loss and writes its gradient block by block
  // so neither its weights nor its gradient need the whole vocabulary on the
  // device. Fixed like head_chunk; 0 = one block of the whole vocabulary.
  int64_t head_block_rows = 0;
};

// The vocabulary blocks of the LM head.
struct HeadBlock {
  int64_t first_row = 0;
  int64_t rows = 0;
};
inline int64_t HeadBlockRows(const ModelDims& m) {
  return m.head_block_rows > 0 && m.head_block_rows < m.vocab ? m.head_block_rows : m.vocab;
}
inline int HeadBlockCount(const ModelDims& m) {
  const int64_t rows = HeadBlockRows(m);
  return rows > 0 ? static_cast<int>((m.vocab + rows - 1) / rows) : 0;
}
inline HeadBlock HeadBlockAt(const ModelDims& m, int b) {
  const int64_t rows = HeadBlockRows(m);
  const int64_t first = static_cast<int64_t>(b) * rows;
  return HeadBlock{first, m.vocab - first < rows ? m.vocab - first : rows};
}

}  // namespace megatrain::engine
