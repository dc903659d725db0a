// cuDNN fused attention (cudnn_attention.h) against our own kernel (ops.h)
// and a double-precision CPU reference, on odd-ish shapes: seq 37 (not a
// multiple of any tile), GQA 4:2, head_dim 64 and 128, one longer GQA 8:2
// shape, a 6:3 one with two batch items and an 8:4 one with four; the backward
// cut into calls (several splits) against one call. Skips without a CUDA device, without the
// cudnn-frontend headers, or where the selection rules (attention_select.h) refuse the device.
//
// Tolerances (|got - want| <= rel * |want| + abs, inputs uniform in [-1, 1)):
//  - out: both rounded to bf16 (2^-9 relative), and cuDNN multiplies P by V
//    on tensor cores with P rounded to bf16: rel 1e-2 + abs 1e-2.
//  - lse: fp32 from bf16 q.k products summed in fp32 by either side (only the
//    summation order differs): rel 1e-4 + abs 1e-3.
//  - dq, dk, dv: sums over up to seq * group terms of products formed from
//    bf16 operands (cuDNN also rounds dP and dS to bf16 for its tensor-core
//    GEMMs): rel 2e-2 + abs 2e-2 against the reference, the bound ops_test
//    gives our kernel; cuDNN against our kernel: 3% of each tensor's max |value|.
//  - The deterministic backward run twice gives the same bits.
#include "kernels/cuda/cudnn_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cuda/attention_select.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/testing/attention_reference.h"

namespace megatrain::kernels::cuda {
namespace {

using testing::DeviceBuffer;
using testing::FromBf16;
using testing::RandomBf16Values;
using testing::TestStream;
using testing::ToBf16;

// The double-precision reference (kernels/cuda/testing/attention_reference.h) of an ops.h
// shape.
testing::AttentionReferenceResult ReferenceAttention(const AttentionShape& s,
                                                     const std::vector<float>& q,
                                                     const std::vector<float>& k,
                                                     const std::vector<float>& v,
                                                     const std::vector<float>& dout) {
  return testing::ReferenceAttention(
      testing::AttentionReferenceShape{s.batch, s.seq, s.q_heads, s.kv_heads, s.head_dim,
                                       s.softmax_scale},
      q, k, v, dout);
}

std::vector<double> ToDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// A shape's inputs, bf16 values in [-1, 1) from seeds seed..seed+3, and the element counts.
struct AttentionInputs {
  size_t nq = 0, nk = 0, nstats = 0;
  std::vector<float> q, k, v, dout;
};
AttentionInputs RandomAttentionInputs(const AttentionShape& s, uint32_t seed) {
  AttentionInputs in;
  const size_t tokens = size_t(s.batch) * s.seq;
  in.nq = tokens * s.q_heads * s.head_dim;
  in.nk = tokens * s.kv_heads * s.head_dim;
  in.nstats = size_t(s.batch) * s.q_heads * s.seq;
  in.q = RandomBf16Values(in.nq, seed, -1.0f, 1.0f);
  in.k = RandomBf16Values(in.nk, seed + 1, -1.0f, 1.0f);
  in.v = RandomBf16Values(in.nk, seed + 2, -1.0f, 1.0f);
  in.dout = RandomBf16Values(in.nq, seed + 3, -1.0f, 1.0f);
  return in;
}

TEST(CudnnHandleTest, CreateReportsCleanly) {
  int count = 0;
  const bool have_device = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  absl::StatusOr<CudnnHandle> handle = CudnnHandle::Create();
  if (have_device) {
    ASSERT_TRUE(handle.ok()) << handle.status();
    EXPECT_NE(handle->get(), nullptr);
    CudnnHandle moved = std::move(*handle);
    EXPECT_NE(moved.get(), nullptr);
    EXPECT_EQ(handle->get(), nullptr);
  } else {
    // No GPU: cudnnCreate fails; the status says so instead of crashing.
    ASSERT_FALSE(handle.ok());
    EXPECT_NE(std::string(handle.status().message()).find("cudnnCreate"), std::string::npos)
        << handle.status();
  }
}

struct Case {
  const char* name;
  AttentionShape shape;
};

class CudnnAttentionTest : public ::testing::TestWithParam<Case> {};

TEST_P(CudnnAttentionTest, MatchesOwnKernelAndReference) {
  MT_SKIP_WITHOUT_CUDA();
  if (!CudnnAttentionBuilt()) GTEST_SKIP() << "built without the cudnn-frontend headers";
  const AttentionShape s = GetParam().shape;
  int device = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, device), cudaSuccess);
  AttentionSelectInputs in;
  in.cudnn_built = true;
  in.sm_major = prop.major;
  in.cudnn_version = CudnnRuntimeVersion();
  const AttentionChoice choice = SelectAttentionImpl(s, in);
  if (choice.impl != AttentionImpl::kCudnn) GTEST_SKIP() << choice.reason;

  const AttentionInputs in_host = RandomAttentionInputs(s, 21);
  const size_t nq = in_host.nq, nk = in_host.nk, nstats = in_host.nstats;
  const auto &q = in_host.q, &k = in_host.k, &v = in_host.v, &dout = in_host.dout;
  DeviceBuffer<uint16_t> dq_in(ToBf16(q)), dk_in(ToBf16(k)), dv_in(ToBf16(v)), ddout(ToBf16(dout));
  TestStream stream;

  // Our kernel (the checker).
  DeviceBuffer<uint16_t> own_out(nq), own_dq(nq), own_dk(nk), own_dv(nk);
  DeviceBuffer<float> own_lse(nstats);
  DeviceBuffer<uint8_t> own_ws(AttentionBackwardWorkspaceBytes(s));
  ASSERT_TRUE(AttentionForward(s, dq_in.get(), dk_in.get(), dv_in.get(), own_out.get(),
                               own_lse.get(), stream.get())
                  .ok());
  ASSERT_TRUE(AttentionBackward(s, dq_in.get(), dk_in.get(), dv_in.get(), own_out.get(),
                                ddout.get(), own_lse.get(), own_dq.get(), own_dk.get(),
                                own_dv.get(), own_ws.get(), AttentionBackwardWorkspaceBytes(s),
                                stream.get())
                  .ok());

  // cuDNN.
  absl::StatusOr<CudnnAttention> cudnn = CudnnAttention::Create();
  ASSERT_TRUE(cudnn.ok()) << cudnn.status();
  absl::StatusOr<CudnnAttentionWorkspace> ws = cudnn->Prepare(s);
  ASSERT_TRUE(ws.ok()) << ws.status();
  std::printf("cuDNN attention workspace: forward %zu, backward %zu bytes (reserved %zu, %zu)\n",
              ws->forward, ws->backward, AttentionForwardWorkspaceBytes(s, AttentionImpl::kCudnn),
              AttentionWorkspaceBytes(s, AttentionImpl::kCudnn));
  // The estimates the arena reserves must cover the plans (else the layer falls back).
  EXPECT_LE(ws->forward, AttentionForwardWorkspaceBytes(s, AttentionImpl::kCudnn));
  EXPECT_LE(ws->backward, AttentionWorkspaceBytes(s, AttentionImpl::kCudnn));
  // Prepare again hits the cache.
  absl::StatusOr<CudnnAttentionWorkspace> again = cudnn->Prepare(s);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->forward, ws->forward);
  EXPECT_EQ(again->backward, ws->backward);
  DeviceBuffer<uint8_t> fwd_ws(std::max<size_t>(ws->forward, 1));
  DeviceBuffer<uint8_t> bwd_ws(std::max<size_t>(ws->backward, 1));
  DeviceBuffer<uint16_t> out(nq), dq(nq), dk(nk), dv(nk);
  DeviceBuffer<float> lse(nstats);
  absl::Status st = cudnn->Forward(s, dq_in.get(), dk_in.get(), dv_in.get(), out.get(), lse.get(),
                                   fwd_ws.get(), ws->forward, stream.get());
  ASSERT_TRUE(st.ok()) << st;
  std::vector<std::vector<uint16_t>> runs;
  for (int run = 0; run < 2; ++run) {
    st =
        cudnn->Backward(s, dq_in.get(), dk_in.get(), dv_in.get(), out.get(), ddout.get(), lse.get(),
                        dq.get(), dk.get(), dv.get(), bwd_ws.get(), ws->backward, stream.get());
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(stream.Sync(), cudaSuccess);
    std::vector<uint16_t> all = dq.Download();
    for (auto* t : {&dk, &dv}) {
      const std::vector<uint16_t> part = t->Download();
      all.insert(all.end(), part.begin(), part.end());
    }
    runs.push_back(std::move(all));
  }
  EXPECT_EQ(runs[0], runs[1]) << "cuDNN attention backward is not bitwise reproducible";

  const testing::AttentionReferenceResult ref = ReferenceAttention(s, q, k, v, dout);
  using testing::ExpectClose;
  using testing::ExpectCloseToMax;
  ExpectClose(FromBf16(out.Download()), ref.out, 1e-2, 1e-2, "cudnn out vs reference");
  ExpectClose(lse.Download(), ref.lse, 1e-4, 1e-3, "cudnn lse vs reference");
  ExpectClose(FromBf16(dq.Download()), ref.dq, 2e-2, 2e-2, "cudnn dq vs reference");
  ExpectClose(FromBf16(dk.Download()), ref.dk, 2e-2, 2e-2, "cudnn dk vs reference");
  ExpectClose(FromBf16(dv.Download()), ref.dv, 2e-2, 2e-2, "cudnn dv vs reference");
  // Same statistics convention as our kernel: one lse could serve either backward.
  ExpectClose(lse.Download(), ToDouble(own_lse.Download()), 1e-4, 1e-3, "cudnn lse vs own lse");
  ExpectCloseToMax(FromBf16(out.Download()), FromBf16(own_out.Download()), 3e-2, "out vs own");
  ExpectCloseToMax(FromBf16(dq.Download()), FromBf16(own_dq.Download()), 3e-2, "dq vs own");
  ExpectCloseToMax(FromBf16(dk.Download()), FromBf16(own_dk.Download()), 3e-2, "dk vs own");
  ExpectCloseToMax(FromBf16(dv.Download()), FromBf16(own_dv.Download()), 3e-2, "dv vs own");

  // Misuse is reported, not executed.
  EXPECT_FALSE(cudnn
                   ->Forward(s, dq_in.get(), dk_in.get(), dv_in.get(), out.get(), lse.get(),
                             fwd_ws.get(), ws->forward, nullptr)
                   .ok());
  AttentionShape other = s;
  other.seq += 1;
  EXPECT_EQ(cudnn
                ->Forward(other, dq_in.get(), dk_in.get(), dv_in.get(), out.get(), lse.get(),
                          fwd_ws.get(), ws->forward, stream.get())
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

// The backward cut into calls (attention_select.h's CudnnBackwardSplit; seq 32768 on a 7B shape
// needs one kv head a call) against the same backward in one call: one batch item x one kv head,
// one item x some kv heads, several items x every head, each on one CudnnAttention (Prepare
// again with another split replaces the graphs). The calls cover every element once (outputs
// start as NaN) and give the same gradients.
TEST_P(CudnnAttentionTest, SplitBackwardMatchesOneCall) {
  MT_SKIP_WITHOUT_CUDA();
  if (!CudnnAttentionBuilt()) GTEST_SKIP() << "built without the cudnn-frontend headers";
  const AttentionShape s = GetParam().shape;
  absl::StatusOr<CudnnAttention> cudnn = CudnnAttention::Create();
  ASSERT_TRUE(cudnn.ok()) << cudnn.status();
  if (s.seq % 4 != 0) {  // never cut: each call's statistics slice must be 16-byte aligned
    EXPECT_EQ(cudnn->Prepare(s, CudnnBackwardSplit{1, 1}).status().code(),
              absl::StatusCode::kInvalidArgument);
    return;
  }
  std::vector<CudnnBackwardSplit> splits = {{1, 1}};
  for (int g = 2; g < s.kv_heads; ++g) {
    if (s.kv_heads % g == 0) splits.push_back({1, g});
  }
  if (s.batch >= 2 && s.batch % 2 == 0) splits.push_back({s.batch / 2, s.kv_heads});
  const AttentionInputs in_host = RandomAttentionInputs(s, 31);
  const size_t nq = in_host.nq, nk = in_host.nk, nstats = in_host.nstats;
  const auto &q = in_host.q, &k = in_host.k, &v = in_host.v, &dout = in_host.dout;
  DeviceBuffer<uint16_t> dq_in(ToBf16(q)), dk_in(ToBf16(k)), dv_in(ToBf16(v)), ddout(ToBf16(dout));
  TestStream stream;

  // dq, dk, dv (each filled with NaN first, so a slice no call wrote shows) for a split.
  const auto backward = [&](const CudnnBackwardSplit& with) -> std::vector<uint16_t> {
    absl::StatusOr<CudnnAttentionWorkspace> ws = cudnn->Prepare(s, with);
    EXPECT_TRUE(ws.ok()) << ws.status();
    if (!ws.ok()) return {};
    std::printf("split %d x %d: backward workspace %zu bytes a call\n", with.batch_per_call,
                with.kv_heads_per_call, ws->backward);
    DeviceBuffer<uint8_t> fwd_ws(std::max<size_t>(ws->forward, 1));
    DeviceBuffer<uint8_t> bwd_ws(std::max<size_t>(ws->backward, 1));
    DeviceBuffer<uint16_t> out(nq), dq(std::vector<uint16_t>(nq, 0x7fc0)),
        dk(std::vector<uint16_t>(nk, 0x7fc0)), dv(std::vector<uint16_t>(nk, 0x7fc0));
    DeviceBuffer<float> lse(nstats);
    absl::Status st = cudnn->Forward(s, dq_in.get(), dk_in.get(), dv_in.get(), out.get(),
                                     lse.get(), fwd_ws.get(), ws->forward, stream.get());
    EXPECT_TRUE(st.ok()) << st;
    st = cudnn->Backward(s, dq_in.get(), dk_in.get(), dv_in.get(), out.get(), ddout.get(),
                         lse.get(), dq.get(), dk.get(), dv.get(), bwd_ws.get(), ws->backward,
                         stream.get());
    EXPECT_TRUE(st.ok()) << st;
    EXPECT_EQ(stream.Sync(), cudaSuccess);
    std::vector<uint16_t> all = dq.Download();
    for (auto* t : {&dk, &dv}) {
      const std::vector<uint16_t> part = t->Download();
      all.insert(all.end(), part.begin(), part.end());
    }
    return all;
  };
  const std::vector<uint16_t> whole = backward(WholeCudnnBackward(s));
  ASSERT_EQ(whole.size(), nq + 2 * nk);
  const testing::AttentionReferenceResult ref = ReferenceAttention(s, q, k, v, dout);
  for (const CudnnBackwardSplit& split : splits) {
    SCOPED_TRACE(::testing::Message() << "split " << split.batch_per_call << " x "
                                      << split.kv_heads_per_call);
    const std::vector<uint16_t> cut = backward(split);
    ASSERT_EQ(cut.size(), whole.size());
    std::printf("split %d x %d: bitwise equal to one call: %s\n", split.batch_per_call,
                split.kv_heads_per_call, cut == whole ? "yes" : "no");
    const std::vector<float> all = FromBf16(cut);
    const std::vector<float> dq(all.begin(), all.begin() + nq);
    const std::vector<float> dk(all.begin() + nq, all.begin() + nq + nk);
    const std::vector<float> dv(all.begin() + nq + nk, all.end());
    testing::ExpectClose(dq, ref.dq, 2e-2, 2e-2, "split dq vs reference");
    testing::ExpectClose(dk, ref.dk, 2e-2, 2e-2, "split dk vs reference");
    testing::ExpectClose(dv, ref.dv, 2e-2, 2e-2, "split dv vs reference");
    testing::ExpectCloseToMax(all, FromBf16(whole), 1e-2, "split vs one call");
  }

  // Splits that do not cut the shape into equal, packed calls are refused by field.
  for (const CudnnBackwardSplit bad : {CudnnBackwardSplit{1, s.kv_heads + 1},
                                       CudnnBackwardSplit{s.batch + 1, s.kv_heads},
                                       CudnnBackwardSplit{-1, 1}}) {
    EXPECT_EQ(cudnn->Prepare(s, bad).status().code(), absl::StatusCode::kInvalidArgument)
        << bad.batch_per_call << " x " << bad.kv_heads_per_call;
  }
  // A refused split leaves the prepared graphs as they were.
  EXPECT_TRUE(cudnn->Prepare(s, splits.back()).ok());
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudnnAttentionTest,
    ::testing::Values(Case{"b2_s37_h4_kv2_d64", AttentionShape{2, 37, 4, 2, 64, 0.125f}},
                      Case{"b2_s37_h4_kv2_d128", AttentionShape{2, 37, 4, 2, 128, 0.08838835f}},
                      Case{"b1_s200_h8_kv2_d128", AttentionShape{1, 200, 8, 2, 128, 0.08838835f}},
                      Case{"b2_s64_h6_kv3_d64", AttentionShape{2, 64, 6, 3, 64, 0.125f}},
                      Case{"b4_s48_h8_kv4_d64", AttentionShape{4, 48, 8, 4, 64, 0.125f}}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace megatrain::kernels::cuda
