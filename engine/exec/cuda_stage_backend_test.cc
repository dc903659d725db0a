// The CUDA StageBackend: its scratch plan against the sizes it reports, its
// refusals (bad dims before the device is touched, non-CUDA streams without
// crashing) and its host embedding stages run here; a layer and the head
// through the backend on a real GPU, against the CPU backend on the same
// bf16-representable inputs, skip with "no CUDA device: ..." without one.
#include "engine/exec/cuda_stage_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "engine/device/cpu_device.h"
#include "engine/device/cuda_device.h"
#include "engine/device/device_test_util.h"
#include "engine/exec/cuda_activation_sets.h"
#include "engine/exec/cuda_layer_math.h"
#include "engine/exec/host_embedding.h"
#include "kernels/common/bf16.h"
#include "kernels/cuda/cuda_test_util.h"

namespace megatrain::engine {
namespace {

using kernels::cuda::testing::FromBf16;
using kernels::cuda::testing::RandomBf16Values;
using kernels::cuda::testing::ToBf16;
using testing::SynchronizeWithin;

using kernels::cuda::testing::ExpectCloseToMax;
// The layer tolerances, with their reasoning, are in cuda_test_util.h.
constexpr double kForwardTolerance = kernels::cuda::testing::kLayerForwardTolerance;
constexpr double kGradientTolerance = kernels::cuda::testing::kLayerGradientTolerance;
constexpr double kLossTolerance = kernels::cuda::testing::kLayerLossTolerance;

ModelDims TestDims() {
  ModelDims m;
  m.vocab = 37;
  m.hidden = 99;  // odd: bf16 rows are only 2-byte aligned
  m.ffn = 75;
  m.q_heads = 4;
  m.kv_heads = 2;
  m.head_dim = 64;
  m.num_layers = 1;
  m.batch = 2;
  m.seq = 13;
  m.head_chunk = 7;  // 26 tokens: chunks 7, 7, 7, 5
  return m;
}

// A Llama layer (no biases) packed with 16-element aligned tensors.
struct PackedLayer {
  LayerOffsets offsets;
  int64_t total = 0;
  std::vector<float> weights;  // bf16-representable
};

PackedLayer PackLayer(const ModelDims& m) {
  PackedLayer p;
  LayerOffsets& o = p.offsets;
  const int64_t d = m.hidden;
  struct Tensor {
    int64_t* offset;
    int64_t count;
    int64_t fan_in;  // 0: a norm
    float qk_scale;
  };
  const std::vector<Tensor> tensors = {{&o.input_norm, d, 0, 1.0f},
                                       {&o.q, m.q_width() * d, d, 1.7f},
                                       {&o.k, m.kv_width() * d, d, 1.7f},
                                       {&o.v, m.kv_width() * d, d, 1.0f},
                                       {&o.o, d * m.q_width(), m.q_width(), 1.0f},
                                       {&o.post_norm, d, 0, 1.0f},
                                       {&o.gate, m.ffn * d, d, 1.0f},
                                       {&o.up, m.ffn * d, d, 1.0f},
                                       {&o.down, d * m.ffn, m.ffn, 1.0f}};
  for (const Tensor& t : tensors) {
    *t.offset = p.total;
    p.total += (t.count + 15) / 16 * 16;
  }
  p.weights.assign(static_cast<size_t>(p.total), 0.0f);
  uint32_t seed = 40;
  for (const Tensor& t : tensors) {
    float lo = 0.8f, hi = 1.2f;
    if (t.fan_in > 0) {
      hi = t.qk_scale / std::sqrt(static_cast<float>(t.fan_in));
      lo = -hi;
    }
    const std::vector<float> v = RandomBf16Values(static_cast<size_t>(t.count), ++seed, lo, hi);
    std::copy(v.begin(), v.end(), p.weights.begin() + *t.offset);
  }
  return p;
}

kernels::cpu::RopeTable TestRope(const ModelDims& m) {
  auto table = kernels::cpu::RopeTable::Create(m.seq, m.head_dim, 10000.0, {});
  EXPECT_TRUE(table.ok()) << table.status();
  return std::move(*table);
}

std::unique_ptr<CpuDevice> MakeCpuDevice(size_t pinned_budget_bytes) {
  DeviceOptions options;
  options.kind = DeviceKind::kCpu;
  options.arena_bytes = size_t{16} << 20;
  options.pinned_budget_bytes = pinned_budget_bytes;
  auto device = CpuDevice::Create(options);
  EXPECT_TRUE(device.ok()) << device.status();
  return device.ok() ? std::move(*device) : nullptr;
}

// ---------------------------------------------------------------- host part

TEST(CudaStageSizesTest, ScratchPlanIsAlignedDisjointAndSizedLikeTheReport) {
  ModelDims one_chunk = TestDims();
  one_chunk.head_dim = 128;
  one_chunk.batch = 3;
  one_chunk.seq = 5;
  one_chunk.head_chunk = 15;
  for (const ModelDims& m : {TestDims(), one_chunk}) {
    const CudaScratchPlan plan = PlanCudaScratch(m);
    const StageSizes sizes = CudaStageSizes(m);
    EXPECT_EQ(sizes.weight_element_bytes, 2u);
    EXPECT_EQ(sizes.activation_element_bytes, 2u);
    EXPECT_EQ(sizes.activation_set_bytes, CudaActivations::Bytes(m));
    EXPECT_EQ(sizes.scratch_bytes, plan.total_bytes);
    for (size_t offset : {plan.backward_offset, plan.head_offset, plan.tables_offset,
                          plan.chunk_losses_offset, plan.total_bytes}) {
      EXPECT_EQ(offset % kCudaCarveAlignment, 0u) << offset;
    }
    EXPECT_GE(plan.head_offset, plan.backward_offset + CudaBackwardScratch::Bytes(m));
    EXPECT_GE(plan.tables_offset, plan.head_offset + CudaHeadScratch::Bytes(m));
    EXPECT_GE(plan.chunk_losses_offset, plan.tables_offset + CudaLayerMath::TablesBytes(m));
    const size_t chunk_bytes = static_cast<size_t>(HeadChunkCount(m)) * sizeof(float);
    EXPECT_GE(plan.total_bytes, plan.chunk_losses_offset + chunk_bytes);
    EXPECT_EQ(CudaStageBackendPinnedBytes(m), chunk_bytes);
  }
  EXPECT_EQ(CudaStageBackendPinnedBytes(TestDims()), 4 * sizeof(float));
  EXPECT_EQ(CudaStageBackendPinnedBytes(one_chunk), 1 * sizeof(float));
}

struct BadInput {
  std::string name;
  ModelDims dims;
  LayerOffsets offsets;
  int64_t rope_head_dim;
  absl::StatusCode code;
  std::string message;
};

TEST(MakeCudaStageBackendTest, RefusesBadDimsNamingTheFieldBeforeTouchingTheDevice) {
  const ModelDims good = TestDims();
  const LayerOffsets offsets = PackLayer(good).offsets;
  std::vector<BadInput> cases;
  {
    ModelDims m = good;
    m.head_dim = 48;
    cases.push_back(
        {"head_dim", m, offsets, 48, absl::StatusCode::kUnimplemented, "dims.head_dim = 48"});
  }
  {
    ModelDims m = good;
    m.kv_heads = 3;
    cases.push_back(
        {"kv_heads", m, offsets, 64, absl::StatusCode::kInvalidArgument, "dims.kv_heads = 3"});
  }
  {
    ModelDims m = good;
    m.hidden = 0;
    cases.push_back(
        {"hidden", m, offsets, 64, absl::StatusCode::kInvalidArgument, "dims.hidden = 0"});
  }
  {
    ModelDims m = good;
    m.head_chunk = -2;
    cases.push_back(
        {"head_chunk", m, offsets, 64, absl::StatusCode::kInvalidArgument, "dims.head_chunk = -2"});
  }
  {
    LayerOffsets o = offsets;
    o.gate = -1;
    cases.push_back(
        {"gate offset", good, o, 64, absl::StatusCode::kInvalidArgument, "offsets.gate = -1"});
  }
  cases.push_back({"rope", good, offsets, 128, absl::StatusCode::kInvalidArgument,
                   "rope table head_dim = 128"});

  // No pinned budget: any touch of the device would fail with its own error.
  std::unique_ptr<CpuDevice> device = MakeCpuDevice(0);
  ASSERT_NE(device, nullptr);
  for (const BadInput& c : cases) {
    auto rope = kernels::cpu::RopeTable::Create(c.dims.seq > 0 ? c.dims.seq : 1, c.rope_head_dim,
                                                10000.0, {});
    ASSERT_TRUE(rope.ok()) << rope.status();
    auto backend = MakeCudaStageBackend(*device, c.dims, c.offsets, *rope);
    ASSERT_FALSE(backend.ok()) << c.name;
    EXPECT_EQ(backend.status().code(), c.code) << c.name << ": " << backend.status();
    EXPECT_NE(backend.status().message().find(c.message), std::string::npos)
        << c.name << ": " << backend.status();
  }
  EXPECT_EQ(device->pinned_stats().allocations, 0u);

  // Good dims do reach the device, whose budget then refuses the chunk losses.
  const kernels::cpu::RopeTable rope = TestRope(good);
  auto backend = MakeCudaStageBackend(*device, good, offsets, rope);
  ASSERT_FALSE(backend.ok());
  EXPECT_NE(backend.status().message().find("chunk losses"), std::string::npos) << backend.status();
}

class CudaStageBackendHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    device_ = MakeCpuDevice(size_t{1} << 20);
    ASSERT_NE(device_, nullptr);
    auto backend = MakeCudaStageBackend(*device_, dims_, layer_.offsets, rope_);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(*backend);
  }

  const ModelDims dims_ = TestDims();
  const PackedLayer layer_ = PackLayer(dims_);
  const kernels::cpu::RopeTable rope_ = TestRope(dims_);
  std::unique_ptr<CpuDevice> device_;
  std::unique_ptr<StageBackend> backend_;
};

TEST_F(CudaStageBackendHostTest, ReportsItsSizesPinnedBytesAndAnEmptyHeadResult) {
  const StageSizes want = CudaStageSizes(dims_);
  EXPECT_EQ(backend_->sizes().scratch_bytes, want.scratch_bytes);
  EXPECT_EQ(backend_->sizes().activation_set_bytes, want.activation_set_bytes);
  EXPECT_EQ(device_->pinned_stats().in_use, CudaStageBackendPinnedBytes(dims_));
  const HeadResultSum head = backend_->head_result();
  EXPECT_EQ(head.loss_sum, 0.0);
  EXPECT_EQ(head.valid_tokens, 0);
}

TEST_F(CudaStageBackendHostTest, RefusesStreamsThatAreNotCudaStreams) {
  auto stream = device_->CreateStream("cpu-setup");
  ASSERT_TRUE(stream.ok()) << stream.status();
  auto scratch = device_->Allocate(backend_->sizes().scratch_bytes, "scratch");
  ASSERT_TRUE(scratch.ok()) << scratch.status();
  const absl::Status bound = backend_->Bind(scratch->data(), {}, nullptr, nullptr, **stream);
  EXPECT_EQ(bound.code(), absl::StatusCode::kInvalidArgument) << bound;
  EXPECT_NE(bound.message().find("'cpu-setup' is not a CUDA stream"), std::string::npos) << bound;

  // Unbound: every stage is refused with its label, nothing is launched.
  const TimelineTag tag{SpanKind::kCompute, "layer 0 forward", 0};
  const absl::Status forward = backend_->LayerForward(**stream, nullptr, nullptr, 0, nullptr, tag);
  EXPECT_EQ(forward.code(), absl::StatusCode::kFailedPrecondition) << forward;
  EXPECT_NE(forward.message().find("layer 0 forward"), std::string::npos) << forward;
  HeadArgs args;
  EXPECT_FALSE(backend_->HeadLoss(**stream, args, tag).ok());
}

TEST_F(CudaStageBackendHostTest, WeightSourceIsTheBf16ComputeCopy) {
  std::vector<uint16_t> compute(8, 0);
  std::vector<float> master(8, 0.0f);
  EntryBuffers entry;
  entry.master = master.data();
  entry.compute_bf16 = compute.data();
  EXPECT_EQ(backend_->WeightSource(entry), compute.data());
}

TEST_F(CudaStageBackendHostTest, WeightSourceWithoutAComputeCopyDies) {
  std::vector<float> master(8, 0.0f);
  EntryBuffers entry;
  entry.master = master.data();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(backend_->WeightSource(entry), "no bf16 compute copy");
}

std::vector<int32_t> RepeatingIds(const ModelDims& m) {
  std::vector<int32_t> ids(static_cast<size_t>(m.tokens()));
  for (int64_t t = 0; t < m.tokens(); ++t) ids[t] = static_cast<int32_t>((t * t + 5) % m.vocab);
  return ids;
}

// The backend's gather of `m`'s repeating ids from a random bf16 table: every row its id's.
void ExpectGatherCopiesTheBf16RowsOfTheIds(const StageBackend& backend, const ModelDims& m,
                                           uint32_t seed) {
  const int64_t d = m.hidden;
  const std::vector<uint16_t> table = ToBf16(RandomBf16Values(m.vocab * d, seed, -2.0f, 2.0f));
  EntryBuffers entry;
  entry.compute_bf16 = const_cast<uint16_t*>(table.data());
  const std::vector<int32_t> ids = RepeatingIds(m);
  std::vector<uint16_t> rows(static_cast<size_t>(m.tokens() * d), 0xFFFF);
  backend.GatherEmbeddingRows(entry, ids.data(), rows.data());
  for (int64_t t = 0; t < m.tokens(); ++t) {
    ASSERT_EQ(std::memcmp(&rows[t * d], &table[ids[t] * d], d * sizeof(uint16_t)), 0)
        << "token " << t;
  }
}

TEST_F(CudaStageBackendHostTest, GatherCopiesTheBf16RowsOfTheIds) {
  ExpectGatherCopiesTheBf16RowsOfTheIds(*backend_, dims_, 3);
}

// From 2^22 elements the gather copies token ranges on host threads: still every row, the
// last range's tail included.
TEST(CudaStageBackendGatherTest, ThreadedGatherCopiesTheBf16RowsOfTheIds) {
  ModelDims m = TestDims();
  m.hidden = 2049;  // odd rows
  m.batch = 8;
  m.seq = 257;  // 2056 tokens x 2049 = 4.2M elements
  const PackedLayer layer = PackLayer(m);
  const kernels::cpu::RopeTable rope = TestRope(m);
  std::unique_ptr<CpuDevice> device = MakeCpuDevice(size_t{1} << 20);
  ASSERT_NE(device, nullptr);
  auto backend = MakeCudaStageBackend(*device, m, layer.offsets, rope);
  ASSERT_TRUE(backend.ok()) << backend.status();
  ExpectGatherCopiesTheBf16RowsOfTheIds(**backend, m, 4);
}

TEST_F(CudaStageBackendHostTest, ScatterIsTheFp32HostScatterOfTheWidenedRows) {
  const int64_t d = dims_.hidden;
  const std::vector<float> row_values = RandomBf16Values(dims_.tokens() * d, 5, -1.0f, 1.0f);
  const std::vector<uint16_t> row_bits = ToBf16(row_values);
  const std::vector<int32_t> ids = RepeatingIds(dims_);
  const std::vector<float> prior = RandomBf16Values(dims_.vocab * d, 6, -0.5f, 0.5f);
  for (bool first : {true, false}) {
    std::vector<float> want = prior;
    ScatterAddEmbeddingRows(row_values.data(), ids.data(), dims_.tokens(), dims_.vocab, d, first,
                            want.data());
    std::vector<float> got = prior;
    backend_->ScatterEmbeddingGradients(row_bits.data(), ids.data(), first, got.data());
    ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
        << "first_contribution " << first;
  }
}

// ----------------------------------------------------------------- GPU part

// One backend on its own device, driven only through the StageBackend
// interface, so the CPU and CUDA backends run the very same test code.
class Rig {
 public:
  static absl::StatusOr<std::unique_ptr<Rig>> Create(DeviceKind kind, const ModelDims& dims,
                                                     const LayerOffsets& offsets,
                                                     const kernels::cpu::RopeTable& rope) {
    auto rig = std::unique_ptr<Rig>(new Rig);
    DeviceOptions options;
    options.kind = kind;
    options.arena_bytes = size_t{256} << 20;
    options.pinned_budget_bytes = size_t{1} << 20;
    if (kind == DeviceKind::kCuda) {
      auto device = CudaDevice::Create(options);
      if (!device.ok()) return device.status();
      rig->device_ = std::move(*device);
      auto backend = MakeCudaStageBackend(*rig->device_, dims, offsets, rope);
      if (!backend.ok()) return backend.status();
      rig->backend_ = std::move(*backend);
    } else {
      auto device = CpuDevice::Create(options);
      if (!device.ok()) return device.status();
      rig->device_ = std::move(*device);
      rig->backend_ = MakeCpuStageBackend(dims, offsets, rope, nullptr);
    }
    auto setup = rig->device_->CreateStream("setup");
    if (!setup.ok()) return setup.status();
    rig->setup_ = std::move(*setup);
    auto compute = rig->device_->CreateStream("compute");
    if (!compute.ok()) return compute.status();
    rig->compute_ = std::move(*compute);

    const StageSizes& sizes = rig->backend_->sizes();
    auto scratch = rig->device_->Allocate(sizes.scratch_bytes, "scratch");
    if (!scratch.ok()) return scratch.status();
    rig->scratch_ = std::move(*scratch);
    std::vector<void*> sets;
    for (int i = 0; i < 2; ++i) {
      auto set = rig->device_->Allocate(sizes.activation_set_bytes, "activation set");
      if (!set.ok()) return set.status();
      sets.push_back(set->data());
      rig->sets_.push_back(std::move(*set));
    }
    std::vector<int32_t> positions(static_cast<size_t>(dims.tokens()));
    for (int64_t t = 0; t < dims.tokens(); ++t) positions[t] = static_cast<int32_t>(t % dims.seq);
    auto device_positions = rig->UploadInts(positions);
    if (!device_positions.ok()) return device_positions.status();
    rig->positions_ = std::move(*device_positions);
    if (absl::Status s = rig->backend_->Bind(rig->scratch_.data(), sets,
                                             rig->positions_.data_as<int32_t>(), nullptr,
                                             *rig->setup_);
        !s.ok()) {
      return s;
    }
    return rig;
  }

  StageBackend& backend() { return *backend_; }
  Stream& compute() { return *compute_; }
  bool bf16() const { return backend_->sizes().activation_element_bytes == 2; }

  // Values in the backend's element type (fp32, or bf16 bits).
  absl::StatusOr<DeviceBuffer> UploadElements(const std::vector<float>& values) {
    if (!bf16()) return UploadBytes(values.data(), values.size() * sizeof(float));
    const std::vector<uint16_t> bits = ToBf16(values);
    return UploadBytes(bits.data(), bits.size() * sizeof(uint16_t));
  }
  absl::StatusOr<DeviceBuffer> UploadFloats(const std::vector<float>& values) {
    return UploadBytes(values.data(), values.size() * sizeof(float));
  }
  absl::StatusOr<DeviceBuffer> UploadInts(const std::vector<int32_t>& values) {
    return UploadBytes(values.data(), values.size() * sizeof(int32_t));
  }
  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) { return device_->Allocate(bytes, "test"); }
  size_t element_bytes() const { return bf16() ? sizeof(uint16_t) : sizeof(float); }

  // After the compute stream has been synchronised.
  absl::StatusOr<std::vector<float>> DownloadElements(const DeviceBuffer& buffer, size_t count) {
    if (!bf16()) return DownloadFloats(buffer, count);
    std::vector<uint16_t> bits(count);
    if (absl::Status s = DownloadBytes(buffer, bits.data(), count * sizeof(uint16_t)); !s.ok()) {
      return s;
    }
    return FromBf16(bits);
  }
  absl::StatusOr<std::vector<float>> DownloadFloats(const DeviceBuffer& buffer, size_t count) {
    std::vector<float> values(count);
    if (absl::Status s = DownloadBytes(buffer, values.data(), count * sizeof(float)); !s.ok()) {
      return s;
    }
    return values;
  }

 private:
  Rig() = default;

  absl::StatusOr<DeviceBuffer> UploadBytes(const void* host, size_t bytes) {
    auto buffer = device_->Allocate(bytes, "test");
    if (!buffer.ok()) return buffer.status();
    setup_->CopyHostToDevice(buffer->data(), host, bytes);
    if (absl::Status s = SynchronizeWithin(*setup_); !s.ok()) return s;  // `host` dies after
    return buffer;
  }
  absl::Status DownloadBytes(const DeviceBuffer& buffer, void* host, size_t bytes) {
    setup_->CopyDeviceToHost(host, buffer.data(), bytes);
    return SynchronizeWithin(*setup_);
  }

  // Declared first, destroyed last: every buffer and stream below is its.
  std::unique_ptr<Device> device_;
  std::unique_ptr<StageBackend> backend_;
  std::unique_ptr<Stream> setup_;
  std::unique_ptr<Stream> compute_;
  DeviceBuffer scratch_;
  std::vector<DeviceBuffer> sets_;
  DeviceBuffer positions_;
};

// What one layer forward + backward produced on one backend.
struct LayerOutputs {
  std::vector<float> x_out, dx_in, grads;
};

void RunLayer(Rig& rig, const ModelDims& m, const PackedLayer& layer, LayerOutputs* out) {
  const size_t nd = static_cast<size_t>(m.tokens() * m.hidden);
  auto weights = rig.UploadElements(layer.weights);
  auto x_in = rig.UploadElements(RandomBf16Values(nd, 7, -1.0f, 1.0f));
  auto dx_out = rig.UploadElements(RandomBf16Values(nd, 8, -1.0f, 1.0f));
  // Garbage where the gradients go: the backend must zero it first.
  auto grads = rig.UploadFloats(std::vector<float>(static_cast<size_t>(layer.total), 7.5f));
  auto x_out = rig.Allocate(nd * rig.element_bytes());
  auto dx_in = rig.Allocate(nd * rig.element_bytes());
  for (auto* b : {&weights, &x_in, &dx_out, &grads, &x_out, &dx_in}) {
    ASSERT_TRUE(b->ok()) << b->status();
  }
  const TimelineTag forward_tag{SpanKind::kCompute, "layer 0 forward", 0};
  const TimelineTag backward_tag{SpanKind::kCompute, "layer 0 backward", 0};
  ASSERT_TRUE(
      rig.backend()
          .LayerForward(rig.compute(), weights->data(), x_in->data(), 1, x_out->data(), forward_tag)
          .ok());
  ASSERT_TRUE(rig.backend()
                  .LayerBackward(rig.compute(), weights->data(), 1, dx_out->data(), dx_in->data(),
                                 grads->data_as<float>(), static_cast<size_t>(layer.total),
                                 backward_tag)
                  .ok());
  const absl::Status synced = SynchronizeWithin(rig.compute());
  ASSERT_TRUE(synced.ok()) << synced;
  auto got_x = rig.DownloadElements(*x_out, nd);
  auto got_dx = rig.DownloadElements(*dx_in, nd);
  auto got_grads = rig.DownloadFloats(*grads, static_cast<size_t>(layer.total));
  ASSERT_TRUE(got_x.ok() && got_dx.ok() && got_grads.ok());
  *out = {std::move(*got_x), std::move(*got_dx), std::move(*got_grads)};
}

class CudaStageBackendGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MT_SKIP_WITHOUT_CUDA();
    auto cpu = Rig::Create(DeviceKind::kCpu, dims_, layer_.offsets, rope_);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    cpu_ = std::move(*cpu);
    auto cuda = Rig::Create(DeviceKind::kCuda, dims_, layer_.offsets, rope_);
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    cuda_ = std::move(*cuda);
  }

  const ModelDims dims_ = TestDims();
  const PackedLayer layer_ = PackLayer(dims_);
  const kernels::cpu::RopeTable rope_ = TestRope(dims_);
  std::unique_ptr<Rig> cpu_;
  std::unique_ptr<Rig> cuda_;
};

TEST_F(CudaStageBackendGpuTest, LayerForwardAndBackwardMatchTheCpuBackend) {
  LayerOutputs want, got;
  ASSERT_NO_FATAL_FAILURE(RunLayer(*cpu_, dims_, layer_, &want));
  ASSERT_NO_FATAL_FAILURE(RunLayer(*cuda_, dims_, layer_, &got));
  ExpectCloseToMax(got.x_out, want.x_out, kForwardTolerance, "x_out");
  ExpectCloseToMax(got.dx_in, want.dx_in, kGradientTolerance, "dx_in");
  ExpectCloseToMax(got.grads, want.grads, kGradientTolerance, "weight gradients");
}

// What one head forward + backward and one loss-only head produced.
struct HeadOutputs {
  HeadResultSum train, eval;
  std::vector<float> dx, grads;
};

void RunHead(Rig& rig, const ModelDims& m, HeadOutputs* out) {
  const int64_t d = m.hidden;
  const size_t nd = static_cast<size_t>(m.tokens() * d);
  const float bound = 3.0f / std::sqrt(static_cast<float>(d));
  std::vector<int32_t> targets(static_cast<size_t>(m.tokens()));
  for (int64_t t = 0; t < m.tokens(); ++t) {
    targets[t] = t % 5 == 3 ? -1 : static_cast<int32_t>((t * 11 + 3) % m.vocab);
  }
  // Gradients packed like the executor packs a stage: entries 64-float aligned.
  const size_t lm_head_at = static_cast<size_t>((d + 63) / 64 * 64);
  const size_t grad_floats = lm_head_at + static_cast<size_t>(m.vocab * d);
  auto norm = rig.UploadElements(RandomBf16Values(d, 20, 0.8f, 1.2f));
  auto lm_head = rig.UploadElements(RandomBf16Values(m.vocab * d, 21, -bound, bound));
  auto x_final = rig.UploadElements(RandomBf16Values(nd, 22, -2.0f, 2.0f));
  auto device_targets = rig.UploadInts(targets);
  // Both gradients are overwritten; the padding between them is left alone.
  auto grads = rig.UploadFloats(std::vector<float>(grad_floats, -3.25f));
  auto dx = rig.Allocate(nd * rig.element_bytes());
  for (auto* b : {&norm, &lm_head, &x_final, &device_targets, &grads, &dx}) {
    ASSERT_TRUE(b->ok()) << b->status();
  }
  HeadArgs args;
  args.final_norm = norm->data();
  args.lm_head = lm_head->data();
  args.x_final = x_final->data();
  args.targets = device_targets->data_as<int32_t>();
  args.host_targets = targets.data();
  args.inv_total_valid = 1.0f / 30.0f;
  args.dx_final = dx->data();
  args.final_norm_grad = grads->data_as<float>();
  args.lm_head_grad = grads->data_as<float>() + lm_head_at;
  const TimelineTag tag{SpanKind::kCompute, "head", -1};

  ASSERT_TRUE(rig.backend().HeadForwardBackward(rig.compute(), args, tag).ok());
  absl::Status synced = SynchronizeWithin(rig.compute());
  ASSERT_TRUE(synced.ok()) << synced;
  out->train = rig.backend().head_result();
  HeadArgs loss_only = args;
  loss_only.dx_final = nullptr;
  loss_only.final_norm_grad = nullptr;
  loss_only.lm_head_grad = nullptr;
  ASSERT_TRUE(rig.backend().HeadLoss(rig.compute(), loss_only, tag).ok());
  synced = SynchronizeWithin(rig.compute());
  ASSERT_TRUE(synced.ok()) << synced;
  out->eval = rig.backend().head_result();
  auto got_dx = rig.DownloadElements(*dx, nd);
  auto got_grads = rig.DownloadFloats(*grads, grad_floats);
  ASSERT_TRUE(got_dx.ok() && got_grads.ok());
  out->dx = std::move(*got_dx);
  out->grads = std::move(*got_grads);
}

TEST_F(CudaStageBackendGpuTest, HeadMatchesTheCpuBackend) {
  HeadOutputs want, got;
  ASSERT_NO_FATAL_FAILURE(RunHead(*cpu_, dims_, &want));
  ASSERT_NO_FATAL_FAILURE(RunHead(*cuda_, dims_, &got));
  ASSERT_GT(want.train.valid_tokens, 0);
  EXPECT_EQ(got.train.valid_tokens, want.train.valid_tokens);
  EXPECT_EQ(got.eval.valid_tokens, want.eval.valid_tokens);
  EXPECT_NEAR(got.train.loss_sum, want.train.loss_sum, kLossTolerance * want.train.loss_sum);
  EXPECT_NEAR(got.eval.loss_sum, want.eval.loss_sum, kLossTolerance * want.eval.loss_sum);
  ExpectCloseToMax(got.dx, want.dx, kGradientTolerance, "dx_final");
  // The padding between the two gradients is untouched on both backends.
  ExpectCloseToMax(got.grads, want.grads, kGradientTolerance, "head gradients");
}

}  // namespace
}  // namespace megatrain::engine
