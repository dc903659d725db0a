// The attention selection rules (attention_select.h): pure host, runs anywhere.
#include "kernels/cuda/attention_select.h"

#include <gtest/gtest.h>

#include "kernels/cuda/ops.h"

namespace megatrain::kernels::cuda {
namespace {

AttentionShape Shape(int head_dim, int seq = 37, int q_heads = 4, int kv_heads = 2) {
  return AttentionShape{2, seq, q_heads, kv_heads, head_dim, 0.125f};
}

// A device that can run it: H100, cuDNN 9.19, built with the frontend.
AttentionSelectInputs Eligible() {
  AttentionSelectInputs in;
  in.cudnn_enabled = true;
  in.cudnn_built = true;
  in.sm_major = 9;
  in.cudnn_version = 91900;
  return in;
}

TEST(AttentionSelectTest, PicksCudnnForLlamaShapes) {
  for (int d : {64, 128}) {
    const AttentionChoice c = SelectAttentionImpl(Shape(d), Eligible());
    EXPECT_EQ(c.impl, AttentionImpl::kCudnn) << d << ": " << c.reason;
  }
  // GQA 8:1 at seq 4096, micro-batch 2 (2.1 GiB of estimated workspace), and MHA.
  EXPECT_EQ(SelectAttentionImpl(Shape(128, 4096, 32, 4), Eligible()).impl, AttentionImpl::kCudnn);
  EXPECT_EQ(SelectAttentionImpl(Shape(64, 37, 4, 4), Eligible()).impl, AttentionImpl::kCudnn);
}

TEST(AttentionSelectTest, OptionAndBuildSwitchesForceOurKernel) {
  AttentionSelectInputs in = Eligible();
  in.cudnn_enabled = false;
  AttentionChoice c = SelectAttentionImpl(Shape(64), in);
  EXPECT_EQ(c.impl, AttentionImpl::kOwnKernel);
  EXPECT_NE(c.reason.find("off"), std::string::npos) << c.reason;

  in = Eligible();
  in.cudnn_built = false;
  c = SelectAttentionImpl(Shape(64), in);
  EXPECT_EQ(c.impl, AttentionImpl::kOwnKernel);
  EXPECT_NE(c.reason.find("cudnn-frontend"), std::string::npos) << c.reason;
}

// Packed samples need attention that respects segment ids: our kernel, whatever else holds.
TEST(AttentionSelectTest, SegmentIdsForceOurKernel) {
  const int32_t fake_segments[1] = {0};  // only the pointer's presence matters here
  for (int d : {64, 128}) {
    AttentionShape shape = Shape(d);
    ASSERT_EQ(SelectAttentionImpl(shape, Eligible()).impl, AttentionImpl::kCudnn);
    shape.segments = fake_segments;
    const AttentionChoice c = SelectAttentionImpl(shape, Eligible());
    EXPECT_EQ(c.impl, AttentionImpl::kOwnKernel) << d;
    EXPECT_NE(c.reason.find("segment ids"), std::string::npos) << c.reason;
    // Its workspace is our kernel's alone.
    EXPECT_EQ(AttentionWorkspaceBytes(shape, c.impl), AttentionBackwardWorkspaceBytes(shape));
  }
}

TEST(AttentionSelectTest, RefusesHeadDimsCudnnDoesNotTake) {
  for (int d : {60, 100, 127, 264, 512}) {
    const AttentionChoice c = SelectAttentionImpl(Shape(d), Eligible());
    EXPECT_EQ(c.impl, AttentionImpl::kOwnKernel) << d;
    EXPECT_NE(c.reason.find("head_dim"), std::string::npos) << c.reason;
  }
  // 256 and 192: Hopper yes, Ampere no, unknown device (planning) yes.
  for (int d : {192, 256}) {
    AttentionSelectInputs in = Eligible();
    EXPECT_EQ(SelectAttentionImpl(Shape(d), in).impl, AttentionImpl::kCudnn) << d;
    in.sm_major = 8;
    EXPECT_EQ(SelectAttentionImpl(Shape(d), in).impl, AttentionImpl::kOwnKernel) << d;
    in.sm_major = 0;
    EXPECT_EQ(SelectAttentionImpl(Shape(d), in).impl, AttentionImpl::kCudnn) << d;
  }
}

TEST(AttentionSelectTest, RefusesOldDevicesAndLibraries) {
  AttentionSelectInputs in = Eligible();
  in.sm_major = 7;
  EXPECT_EQ(SelectAttentionImpl(Shape(64), in).impl, AttentionImpl::kOwnKernel);
  in = Eligible();
  in.cudnn_version = 8906;
  EXPECT_EQ(SelectAttentionImpl(Shape(64), in).impl, AttentionImpl::kOwnKernel);
  in = Eligible();
  in.sm_major = 0;
  in.cudnn_version = 0;  // not known yet (planning): eligible
  EXPECT_EQ(SelectAttentionImpl(Shape(64), in).impl, AttentionImpl::kCudnn);
}

TEST(AttentionSelectTest, InvalidShapesGoToOurKernelWhichReportsThem) {
  EXPECT_EQ(SelectAttentionImpl(Shape(64, 37, 6, 4), Eligible()).impl, AttentionImpl::kOwnKernel);
  EXPECT_EQ(SelectAttentionImpl(Shape(64, 0), Eligible()).impl, AttentionImpl::kOwnKernel);
  AttentionShape s = Shape(64);
  s.softmax_scale = 0.0f;
  EXPECT_EQ(SelectAttentionImpl(s, Eligible()).impl, AttentionImpl::kOwnKernel);
  EXPECT_EQ(CudnnAttentionBackwardWorkspaceEstimateBytes(s), 0u);
}

TEST(AttentionSelectTest, WorkspaceEstimateAndCap) {
  // b 1, 32 heads, seq 4096, d 128: dP 1 GiB + dQ accumulator 64 MiB + row sums 1 MiB + 1 MiB.
  const AttentionShape big{1, 4096, 32, 8, 128, 0.088f};
  const size_t expected =
      (size_t{1} << 30) + (size_t{64} << 20) + (size_t{1} << 20) + (size_t{1} << 20);
  EXPECT_EQ(CudnnAttentionBackwardWorkspaceEstimateBytes(big), expected);
  EXPECT_EQ(SelectAttentionImpl(big, Eligible()).impl, AttentionImpl::kCudnn);
  EXPECT_EQ(SplitCudnnAttentionBackward(big, kDefaultCudnnAttentionWorkspaceCap),
            WholeCudnnBackward(big));
  AttentionSelectInputs in = Eligible();
  // A 512 MiB cap: two kv heads (8 query heads) a call, 272 MiB each: four calls.
  in.workspace_cap_bytes = size_t{512} << 20;
  const AttentionChoice c = SelectAttentionImpl(big, in);
  EXPECT_EQ(c.impl, AttentionImpl::kCudnn);
  EXPECT_NE(c.reason.find("backward in 4 calls of 1 batch item(s) x 2 kv head(s)"),
            std::string::npos)
      << c.reason;
  EXPECT_EQ(SplitCudnnAttentionBackward(big, in.workspace_cap_bytes), (CudnnBackwardSplit{1, 2}));
  // A 64 MiB cap: one kv head's four query heads already need 128 MiB of dP.
  in.workspace_cap_bytes = size_t{64} << 20;
  const AttentionChoice refused = SelectAttentionImpl(big, in);
  EXPECT_EQ(refused.impl, AttentionImpl::kOwnKernel);
  EXPECT_NE(refused.reason.find("one batch item and one kv head"), std::string::npos)
      << refused.reason;
  EXPECT_FALSE(SplitCudnnAttentionBackward(big, in.workspace_cap_bytes).valid());
  in.workspace_cap_bytes = 0;  // no cap
  EXPECT_EQ(SelectAttentionImpl(big, in).impl, AttentionImpl::kCudnn);
  EXPECT_EQ(SplitCudnnAttentionBackward(big, 0), WholeCudnnBackward(big));
  // seq 16384 at 32 heads: 16 GiB of dP in one call; two calls of 4 kv heads fit the cap.
  const AttentionShape s16k{1, 16384, 32, 8, 128, 0.088f};
  EXPECT_EQ(SelectAttentionImpl(s16k, Eligible()).impl, AttentionImpl::kCudnn);
  EXPECT_EQ(SplitCudnnAttentionBackward(s16k, kDefaultCudnnAttentionWorkspaceCap),
            (CudnnBackwardSplit{1, 4}));
  // seq 32768 at 32 heads: 64 GiB of dP; one kv head a call (8 GiB + 65 MiB), eight calls.
  const AttentionShape s32k{1, 32768, 32, 8, 128, 0.088f};
  EXPECT_EQ(SelectAttentionImpl(s32k, Eligible()).impl, AttentionImpl::kCudnn);
  EXPECT_EQ(SplitCudnnAttentionBackward(s32k, kDefaultCudnnAttentionWorkspaceCap),
            (CudnnBackwardSplit{1, 1}));
  EXPECT_LE(AttentionWorkspaceBytes(s32k, AttentionImpl::kCudnn),
            kDefaultCudnnAttentionWorkspaceCap);
  // The measured case (Qwen2.5-7B at seq 32768: 28 query heads over 4 kv heads; the H200 run
  // of 2026-11-28 fell back to our kernel at 60.6 GB in one call): four calls of 15.2 GB.
  const AttentionShape qwen7b_32k{1, 32768, 28, 4, 128, 0.088f};
  EXPECT_EQ(SplitCudnnAttentionBackward(qwen7b_32k, kDefaultCudnnAttentionWorkspaceCap),
            (CudnnBackwardSplit{1, 1}));
  EXPECT_EQ(CudnnAttentionBackwardWorkspaceEstimateBytes(qwen7b_32k),
            size_t{60607692800});  // logged
  EXPECT_EQ(SelectAttentionImpl(qwen7b_32k, Eligible()).impl, AttentionImpl::kCudnn);
  // A seq that is not a multiple of 4 is never cut (unaligned statistics slices), and the
  // refusal says so.
  const AttentionShape uncut{1, 32766, 32, 8, 128, 0.088f};
  EXPECT_FALSE(SplitCudnnAttentionBackward(uncut, kDefaultCudnnAttentionWorkspaceCap).valid());
  const AttentionChoice uncut_choice = SelectAttentionImpl(uncut, Eligible());
  EXPECT_EQ(uncut_choice.impl, AttentionImpl::kOwnKernel);
  EXPECT_NE(uncut_choice.reason.find("not a multiple of 4"), std::string::npos)
      << uncut_choice.reason;
  EXPECT_EQ(SplitCudnnAttentionBackward(AttentionShape{2, 37, 4, 2, 64, 0.125f}, size_t{1} << 30),
            (CudnnBackwardSplit{2, 2}));
  // seq 65536: one kv head a call is 32 GiB of dP: our kernel.
  EXPECT_EQ(SelectAttentionImpl(AttentionShape{1, 65536, 32, 8, 128, 0.088f}, Eligible()).impl,
            AttentionImpl::kOwnKernel);
  // b 4 at seq 8192, 32 heads: 16.5 GiB in one call; the fewest calls within 16 GiB are two
  // (8.3 GiB each). Four items x 4 kv heads would be two calls too, but its statistics slice
  // is not packed; two items x all heads is.
  const AttentionShape b4{4, 8192, 32, 8, 128, 0.088f};
  const CudnnBackwardSplit b4_split =
      SplitCudnnAttentionBackward(b4, kDefaultCudnnAttentionWorkspaceCap);
  EXPECT_EQ(b4_split, (CudnnBackwardSplit{2, 8}));
  const AttentionShape b4_call = CudnnBackwardCallShape(b4, b4_split);
  EXPECT_EQ(b4_call.batch, 2);
  EXPECT_EQ(b4_call.q_heads, 32);
  EXPECT_EQ(b4_call.kv_heads, 8);
  // With a cap below one item's 4.1 GiB: one item x 4 kv heads a call (8 calls), never
  // several items x some heads.
  EXPECT_EQ(SplitCudnnAttentionBackward(b4, size_t{3} << 30), (CudnnBackwardSplit{1, 4}));
  EXPECT_LE(CudnnAttentionBackwardWorkspaceEstimateBytes(b4_call),
            kDefaultCudnnAttentionWorkspaceCap);
  // Seq rounds up to 64 for the dP term.
  const AttentionShape odd{2, 37, 4, 2, 64, 0.125f};
  EXPECT_GE(CudnnAttentionBackwardWorkspaceEstimateBytes(odd), size_t{2} * 4 * 64 * 64 * 2);
}

TEST(AttentionSelectTest, ReservedWorkspaceCoversBothImplementations) {
  const AttentionShape s = Shape(128);
  EXPECT_EQ(AttentionWorkspaceBytes(s, AttentionImpl::kOwnKernel),
            AttentionBackwardWorkspaceBytes(s));
  EXPECT_GE(AttentionWorkspaceBytes(s, AttentionImpl::kCudnn), AttentionBackwardWorkspaceBytes(s));
  EXPECT_GE(AttentionWorkspaceBytes(s, AttentionImpl::kCudnn),
            CudnnAttentionBackwardWorkspaceEstimateBytes(s));
  EXPECT_EQ(AttentionForwardWorkspaceBytes(s, AttentionImpl::kOwnKernel), 0u);
  EXPECT_EQ(AttentionForwardWorkspaceBytes(s, AttentionImpl::kCudnn),
            CudnnAttentionForwardWorkspaceEstimateBytes(s));
  EXPECT_GE(CudnnAttentionForwardWorkspaceEstimateBytes(s), size_t{1} << 20);
}

TEST(AttentionSelectTest, EnvironmentSwitch) {
  EXPECT_TRUE(CudnnAttentionAllowedByEnvValue(nullptr));
  EXPECT_TRUE(CudnnAttentionAllowedByEnvValue(""));
  EXPECT_TRUE(CudnnAttentionAllowedByEnvValue("1"));
  EXPECT_TRUE(CudnnAttentionAllowedByEnvValue("on"));
  for (const char* off : {"0", "off", "OFF", "false", "no", "ours", " 0 "}) {
    EXPECT_FALSE(CudnnAttentionAllowedByEnvValue(off)) << off;
  }
}

TEST(AttentionSelectTest, ImplNames) {
  EXPECT_STREQ(AttentionImplName(AttentionImpl::kCudnn), "cudnn");
  EXPECT_STREQ(AttentionImplName(AttentionImpl::kOwnKernel), "own-kernel");
}

}  // namespace
}  // namespace megatrain::kernels::cuda
