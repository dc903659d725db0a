// Host-side checks of the CUDA layer math: the carved layouts (every piece
// aligned, inside Bytes(), no overlap, sized for the dims) and the dims
// validation Create runs before touching a device. Runs without a GPU.
#include "engine/exec/cuda_activation_sets.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "engine/exec/cuda_layer_math.h"

namespace megatrain::engine {
namespace {

using ::testing::HasSubstr;

// An odd-sized micro-batch: nothing is a multiple of a SIMD width or 256 B.
ModelDims OddDims() {
  ModelDims m;
  m.vocab = 37;
  m.hidden = 99;
  m.ffn = 75;
  m.q_heads = 4;
  m.kv_heads = 2;
  m.head_dim = 64;
  m.num_layers = 2;
  m.batch = 2;
  m.seq = 13;
  m.head_chunk = 7;
  return m;
}

ModelDims LargerDims() {
  ModelDims m = OddDims();
  m.vocab = 32001;
  m.hidden = 1021;
  m.ffn = 2753;
  m.q_heads = 6;
  m.kv_heads = 3;
  m.head_dim = 128;
  m.batch = 3;
  m.seq = 257;
  m.head_chunk = 129;
  return m;
}

// Qwen3's shape: per-head q/k norms, q width 16 * 128 = 2048 wider than d = 1024, so the
// per-head norms' dw workspace is larger than the layer norms'.
ModelDims Qwen3Dims() {
  ModelDims m = OddDims();
  m.hidden = 1024;
  m.ffn = 3072;
  m.q_heads = 16;
  m.kv_heads = 8;
  m.head_dim = 128;
  m.batch = 2;
  m.seq = 300;
  m.head_chunk = 128;
  m.qk_norm = true;
  return m;
}

struct Piece {
  const void* p;
  size_t bytes;
  std::string name;
};

template <class T>
Piece P(T* p, int64_t count, const char* name) {
  return Piece{p, sizeof(T) * static_cast<size_t>(count), name};
}

// Host memory standing in for an arena block (never dereferenced by Carve).
struct AlignedBlock {
  explicit AlignedBlock(size_t bytes)
      : ptr(std::aligned_alloc(
            kCudaCarveAlignment,
            (bytes + kCudaCarveAlignment - 1) / kCudaCarveAlignment * kCudaCarveAlignment +
                kCudaCarveAlignment)) {}
  ~AlignedBlock() { std::free(ptr); }
  void* ptr;
};

void ExpectWellCarved(const std::vector<Piece>& pieces, const void* base, size_t total,
                      const std::string& what) {
  SCOPED_TRACE(what);
  const auto b = reinterpret_cast<uintptr_t>(base);
  std::vector<Piece> sorted = pieces;
  std::sort(sorted.begin(), sorted.end(), [](const Piece& x, const Piece& y) {
    return reinterpret_cast<uintptr_t>(x.p) < reinterpret_cast<uintptr_t>(y.p);
  });
  uintptr_t previous_end = b;
  for (const Piece& piece : sorted) {
    const auto start = reinterpret_cast<uintptr_t>(piece.p);
    EXPECT_NE(piece.p, nullptr) << piece.name;
    EXPECT_GT(piece.bytes, 0u) << piece.name;
    EXPECT_EQ((start - b) % kCudaCarveAlignment, 0u) << piece.name;
    EXPECT_GE(start, previous_end) << piece.name << " overlaps the piece before it";
    EXPECT_LE(start + piece.bytes, b + total) << piece.name << " ends past Bytes()";
    previous_end = start + piece.bytes;
  }
  // No more than one alignment's padding per piece.
  size_t payload = 0;
  for (const Piece& piece : pieces) payload += piece.bytes;
  EXPECT_LE(total, payload + pieces.size() * kCudaCarveAlignment);
}

class CudaCarveTest : public ::testing::TestWithParam<ModelDims> {};

TEST_P(CudaCarveTest, ActivationsArePackedAlignedAndSized) {
  const ModelDims m = GetParam();
  const int64_t n = m.tokens();
  const size_t bytes = CudaActivations::Bytes(m);
  AlignedBlock block(bytes);
  const CudaActivations a = CudaActivations::Carve(m, block.ptr);
  EXPECT_EQ(static_cast<const void*>(a.x_in), block.ptr);
  std::vector<Piece> pieces = {
      P(a.x_in, n * m.hidden, "x_in"), P(a.h1, n * m.hidden, "h1"), P(a.rstd1, n, "rstd1"),
      P(a.q, n * m.q_width(), "q"), P(a.k, n * m.kv_width(), "k"), P(a.v, n * m.kv_width(), "v"),
      P(a.attn, n * m.q_width(), "attn"), P(a.lse, m.batch * m.q_heads * m.seq, "lse"),
      P(a.x_mid, n * m.hidden, "x_mid"), P(a.h2, n * m.hidden, "h2"), P(a.rstd2, n, "rstd2"),
      P(a.gate, n * m.ffn, "gate"), P(a.up, n * m.ffn, "up"), P(a.act, n * m.ffn, "act")};
  if (m.qk_norm) {  // otherwise these pieces are empty
    for (Piece piece : {P(a.q_proj, n * m.q_width(), "q_proj"),
                        P(a.k_proj, n * m.kv_width(), "k_proj"),
                        P(a.rstd_q, n * m.q_heads, "rstd_q"), P(a.rstd_k, n * m.kv_heads, "rstd_k")}) {
      pieces.push_back(piece);
    }
  }
  ExpectWellCarved(pieces, block.ptr, bytes, "CudaActivations");
}

TEST_P(CudaCarveTest, BackwardScratchHoldsTheKernelsWorkspaces) {
  const ModelDims m = GetParam();
  const int64_t n = m.tokens();
  const size_t bytes = CudaBackwardScratch::Bytes(m);
  AlignedBlock block(bytes);
  const CudaBackwardScratch s = CudaBackwardScratch::Carve(m, block.ptr);
  int64_t norm_floats = kernels::cuda::RmsnormBackwardWorkspaceFloats(n, static_cast<int>(m.hidden));
  if (m.qk_norm) {  // the per-head norms' backward uses the same workspace
    norm_floats = std::max(norm_floats, kernels::cuda::RmsnormBackwardWorkspaceFloats(
                                            n * m.q_heads, static_cast<int>(m.head_dim)));
  }
  EXPECT_EQ(s.norm_workspace_floats, norm_floats);
  EXPECT_GT(s.norm_workspace_floats, 0);
  EXPECT_EQ(s.attention_workspace_bytes, CudaAttentionWorkspaceBytes(m));
  // Room for our kernel whichever implementation the plan reserves for.
  EXPECT_GE(s.attention_workspace_bytes,
            kernels::cuda::AttentionBackwardWorkspaceBytes(CudaAttentionShape(m)));
  EXPECT_GE(s.attention_workspace_bytes, sizeof(float) * m.batch * m.q_heads * m.seq);
  ExpectWellCarved({P(s.d_act, n * m.ffn, "d_act"), P(s.d_gate, n * m.ffn, "d_gate"),
                    P(s.d_up, n * m.ffn, "d_up"), P(s.d_h, n * m.hidden, "d_h"),
                    P(s.d_attn, n * m.q_width(), "d_attn"), P(s.d_q, n * m.q_width(), "d_q"),
                    P(s.d_k, n * m.kv_width(), "d_k"), P(s.d_v, n * m.kv_width(), "d_v"),
                    P(s.norm_workspace, s.norm_workspace_floats, "norm_workspace"),
                    P(static_cast<char*>(s.attention_workspace),
                      static_cast<int64_t>(s.attention_workspace_bytes), "attention_workspace")},
                   block.ptr, bytes, "CudaBackwardScratch");
}

TEST_P(CudaCarveTest, HeadScratchHoldsOneBlockChunk) {
  const ModelDims m = GetParam();
  const int64_t n = m.tokens();
  const size_t bytes = CudaHeadScratch::Bytes(m);
  AlignedBlock block(bytes);
  const CudaHeadScratch h = CudaHeadScratch::Carve(m, block.ptr);
  EXPECT_EQ(h.norm_workspace_floats,
            kernels::cuda::RmsnormBackwardWorkspaceFloats(n, static_cast<int>(m.hidden)));
  ExpectWellCarved(
      {P(h.h, n * m.hidden, "h"), P(h.rstd, n, "rstd"), P(h.d_h, n * m.hidden, "d_h"),
       P(h.row_max, n, "row_max"), P(h.row_sum, n, "row_sum"),
       P(h.target_logit, n, "target_logit"),
       P(h.logits, m.head_chunk * HeadBlockRows(m), "logits"),
       P(h.logits_f32, CudaHeadLogitsRows(m) * HeadBlockRows(m), "logits_f32"),
       P(h.row_loss, m.head_chunk, "row_loss"),
       P(h.norm_workspace, h.norm_workspace_floats, "norm_workspace")},
      block.ptr, bytes, "CudaHeadScratch");
}

TEST_P(CudaCarveTest, TablesHoldRopeRowsAndOnes) {
  const ModelDims m = GetParam();
  const size_t bytes = CudaLayerMath::TablesBytes(m);
  EXPECT_EQ(bytes, CudaLayerTables::Bytes(m));
  AlignedBlock block(bytes);
  const CudaLayerTables t = CudaLayerTables::Carve(m, block.ptr);
  std::vector<Piece> pieces = {P(t.rope_cos, m.seq * m.head_dim / 2, "rope_cos"),
                               P(t.rope_sin, m.seq * m.head_dim / 2, "rope_sin"),
                               P(t.ones, m.tokens(), "ones")};
  EXPECT_EQ(t.attention_forward_workspace_bytes, CudaAttentionForwardWorkspaceBytes(m));
  if (t.attention_forward_workspace_bytes > 0) {
    pieces.push_back(P(static_cast<char*>(t.attention_forward_workspace),
                       static_cast<int64_t>(t.attention_forward_workspace_bytes),
                       "attention_forward_workspace"));
  } else {
    EXPECT_EQ(t.attention_forward_workspace, nullptr);
  }
  ExpectWellCarved(pieces, block.ptr, bytes, "CudaLayerTables");
}

// The plan reserves for cuDNN exactly when the selection (device unknown)
// picks it: built with the frontend, not switched off, a head_dim it takes.
TEST_P(CudaCarveTest, AttentionReservationFollowsThePlannedImplementation) {
  const ModelDims m = GetParam();
  const kernels::cuda::AttentionShape shape = CudaAttentionShape(m);
  const kernels::cuda::AttentionImpl planned = PlannedAttentionImpl(m);
  if (!kernels::cuda::CudnnAttentionBuilt() || !kernels::cuda::CudnnAttentionAllowedByEnv()) {
    EXPECT_EQ(planned, kernels::cuda::AttentionImpl::kOwnKernel);
  }
  EXPECT_EQ(CudaAttentionWorkspaceBytes(m), kernels::cuda::AttentionWorkspaceBytes(shape, planned));
  EXPECT_EQ(CudaAttentionForwardWorkspaceBytes(m),
            kernels::cuda::AttentionForwardWorkspaceBytes(shape, planned));
  if (planned == kernels::cuda::AttentionImpl::kCudnn) {
    // One call's estimate: a shape over the cap runs its backward in several calls.
    const kernels::cuda::CudnnBackwardSplit split = kernels::cuda::SplitCudnnAttentionBackward(
        shape, kernels::cuda::kDefaultCudnnAttentionWorkspaceCap);
    ASSERT_TRUE(split.valid());
    EXPECT_GE(CudaAttentionWorkspaceBytes(m),
              kernels::cuda::CudnnAttentionBackwardWorkspaceEstimateBytes(
                  kernels::cuda::CudnnBackwardCallShape(shape, split)));
    EXPECT_GT(CudaAttentionForwardWorkspaceBytes(m), 0u);
  } else {
    EXPECT_EQ(CudaAttentionForwardWorkspaceBytes(m), 0u);
  }
}

TEST_P(CudaCarveTest, CarvingIsAPureFunctionOfTheDims) {
  const ModelDims m = GetParam();
  const size_t bytes = CudaActivations::Bytes(m);
  AlignedBlock first(bytes), second(bytes);
  const CudaActivations a = CudaActivations::Carve(m, first.ptr);
  const CudaActivations b = CudaActivations::Carve(m, second.ptr);
  const auto offset = [](const void* p, const void* base) {
    return reinterpret_cast<uintptr_t>(p) - reinterpret_cast<uintptr_t>(base);
  };
  EXPECT_EQ(offset(a.act, first.ptr), offset(b.act, second.ptr));
  EXPECT_EQ(offset(a.lse, first.ptr), offset(b.lse, second.ptr));
  EXPECT_EQ(CudaActivations::Bytes(m), bytes);
}

INSTANTIATE_TEST_SUITE_P(Dims, CudaCarveTest,
                         ::testing::Values(OddDims(), LargerDims(), Qwen3Dims()));

TEST(HeadChunkCountTest, CoversEveryTokenOnce) {
  ModelDims m = OddDims();  // 26 tokens in chunks of 7: 7, 7, 7, 5
  EXPECT_EQ(HeadChunkCount(m), 4);
  m.head_chunk = 26;
  EXPECT_EQ(HeadChunkCount(m), 1);
  m.head_chunk = 1;
  EXPECT_EQ(HeadChunkCount(m), 26);
  m.head_chunk = 1000;
  EXPECT_EQ(HeadChunkCount(m), 1);
}

TEST(SumChunkLossesTest, AddsInChunkOrderInDouble) {
  const std::vector<float> sums = {1.5f, 2.25f, 1e-8f, 3.0f};
  EXPECT_DOUBLE_EQ(CudaLayerMath::SumChunkLosses(sums), 1.5 + 2.25 + double{1e-8f} + 3.0);
  EXPECT_EQ(CudaLayerMath::SumChunkLosses({}), 0.0);
}

// ---- Validation (before any device call) ----

LayerOffsets PackedOffsets() {
  LayerOffsets o;
  int64_t at = 0;
  for (int64_t* field :
       {&o.input_norm, &o.q, &o.k, &o.v, &o.o, &o.post_norm, &o.gate, &o.up, &o.down}) {
    *field = at;
    at += 1 << 16;
  }
  return o;
}

kernels::cpu::RopeTable Rope(int64_t positions, int64_t head_dim) {
  auto table = kernels::cpu::RopeTable::Create(positions, head_dim, 10000.0, {});
  EXPECT_TRUE(table.ok()) << table.status();
  return std::move(*table);
}

TEST(CudaLayerMathValidateTest, AcceptsTheOddTestDims) {
  EXPECT_TRUE(CudaLayerMath::Validate(OddDims(), PackedOffsets(), Rope(13, 64)).ok());
  EXPECT_TRUE(CudaLayerMath::Validate(LargerDims(), PackedOffsets(), Rope(300, 128)).ok());
}

TEST(CudaLayerMathValidateTest, RefusesWhatTheKernelsCannotDoNamingTheField) {
  const LayerOffsets o = PackedOffsets();
  ModelDims m = OddDims();
  m.head_dim = 96;
  absl::Status s = CudaLayerMath::Validate(m, o, Rope(13, 96));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("dims.head_dim = 96"));

  m = OddDims();
  m.kv_heads = 3;
  s = CudaLayerMath::Validate(m, o, Rope(13, 64));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("dims.kv_heads = 3"));

  m = OddDims();
  m.sliding_window = 8;
  s = CudaLayerMath::Validate(m, o, Rope(13, 64));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("dims.sliding_window = 8"));
  m.sliding_window = 13;  // a window covering the sequence changes nothing
  EXPECT_TRUE(CudaLayerMath::Validate(m, o, Rope(13, 64)).ok());

  m = OddDims();
  m.head_chunk = 0;
  s = CudaLayerMath::Validate(m, o, Rope(13, 64));
  EXPECT_THAT(s.message(), HasSubstr("dims.head_chunk = 0"));

  m = OddDims();
  m.rms_eps = 0.0f;
  EXPECT_THAT(CudaLayerMath::Validate(m, o, Rope(13, 64)).message(), HasSubstr("dims.rms_eps"));

  m = OddDims();
  m.batch = int64_t{1} << 20;
  m.seq = int64_t{1} << 12;
  s = CudaLayerMath::Validate(m, o, Rope(m.seq, 64));
  EXPECT_THAT(s.message(), HasSubstr("dims.batch * dims.seq"));
}

TEST(CudaLayerMathValidateTest, RefusesMissingTensorsAndMismatchedRope) {
  LayerOffsets o = PackedOffsets();
  o.gate = -1;
  absl::Status s = CudaLayerMath::Validate(OddDims(), o, Rope(13, 64));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("offsets.gate = -1"));

  s = CudaLayerMath::Validate(OddDims(), PackedOffsets(), Rope(12, 64));
  EXPECT_THAT(s.message(), HasSubstr("max_positions = 12"));
  s = CudaLayerMath::Validate(OddDims(), PackedOffsets(), Rope(13, 128));
  EXPECT_THAT(s.message(), HasSubstr("head_dim = 128"));
}

TEST(CudaLayerMathValidateTest, QkNormsComeWithDimsQkNorm) {
  LayerOffsets o = PackedOffsets();
  o.q_norm = 9 << 16;
  o.k_norm = 10 << 16;
  EXPECT_TRUE(CudaLayerMath::Validate(Qwen3Dims(), o, Rope(300, 128)).ok());
  // Norm weights without dims.qk_norm: the activation sets would have no room
  // for the projections they read.
  absl::Status s = CudaLayerMath::Validate(OddDims(), o, Rope(13, 64));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("dims.qk_norm = false"));
  o.k_norm = -1;  // only one of the pair
  s = CudaLayerMath::Validate(Qwen3Dims(), o, Rope(300, 128));
  EXPECT_THAT(s.message(), HasSubstr("offsets.k_norm = -1"));
}

TEST(CudaLayerMathValidateTest, CreateValidatesBeforeTouchingTheDevice) {
  ModelDims m = OddDims();
  m.head_dim = 80;
  AlignedBlock tables(1024);
  const auto created = CudaLayerMath::Create(m, PackedOffsets(), Rope(13, 80), tables.ptr,
                                             reinterpret_cast<cudaStream_t>(0x1000));
  ASSERT_FALSE(created.ok());
  EXPECT_THAT(created.status().message(), HasSubstr("dims.head_dim = 80"));

  const auto unaligned = CudaLayerMath::Create(OddDims(), PackedOffsets(), Rope(13, 64),
                                               static_cast<char*>(tables.ptr) + 32,
                                               reinterpret_cast<cudaStream_t>(0x1000));
  ASSERT_FALSE(unaligned.ok());
  EXPECT_THAT(unaligned.status().message(), HasSubstr("aligned"));

  const auto default_stream =
      CudaLayerMath::Create(OddDims(), PackedOffsets(), Rope(13, 64), tables.ptr, nullptr);
  ASSERT_FALSE(default_stream.ok());
  EXPECT_THAT(default_stream.status().message(), HasSubstr("default stream"));
}

}  // namespace
}  // namespace megatrain::engine
