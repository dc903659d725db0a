// Overlap is measured, not assumed: with the emulated link throttled so one
// layer's weight copy takes about twice its compute, the stream timeline shows
// layer i+1's copy-in running while layer i computes; the Chrome trace export
// of that timeline is valid JSON with the three streams.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "nlohmann/json.hpp"
#include "tests/engine/tiny_model.h"

namespace megatrain::engine {
namespace {

using testing::MakeCpuDevice;
using testing::MakeTokenBatches;
using testing::TinyConfig;
using testing::TinyShape;

struct Span {
  int64_t begin = 0, end = 0;
};

TEST(OverlapTest, NextLayerCopyRunsDuringThisLayersCompute) {
  TinyShape shape;
  shape.layers = 6;
  shape.hidden = 128;
  shape.ffn = 352;
  shape.heads = 4;
  shape.kv_heads = 2;
  TrainerOptions o;
  o.micro_batch_size = 2;
  o.seq_len = 64;
  o.lr.total_steps = 3;
  o.executor.weight_slots = 2;
  o.executor.checkpoint_interval = 2;
  o.collect_timeline = true;
  const auto batches = MakeTokenBatches(3, 128, shape.vocab, 11);

  // Calibrate: forward compute time of a layer on an unthrottled link.
  double compute_seconds = 0;
  size_t layer_bytes = 0;
  {
    auto device = MakeCpuDevice(size_t{64} << 20);
    auto trainer = Trainer::Create(*device, TinyConfig(shape), o);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    (*trainer)->InitializeRandom(3);
    layer_bytes = (*trainer)->store().spec(1).elements * sizeof(float);
    for (int step = 0; step < 2; ++step) {
      auto r = (*trainer)->Step(batches.InputPointers(step, 1), batches.TargetPointers(step, 1));
      ASSERT_TRUE(r.ok()) << r.status();
    }
    int64_t total = 0, count = 0;
    for (const TimelineSpan& s : device->timeline().Spans()) {
      if (s.kind == SpanKind::kCompute && s.label.rfind("layer.fwd.", 0) == 0) {
        total += s.end_ns - s.begin_ns;
        ++count;
      }
    }
    ASSERT_GT(count, 0);
    compute_seconds = static_cast<double>(total) / count * 1e-9;
  }
  // A link at which one layer's copy takes 2x its forward compute.
  const double gbps = static_cast<double>(layer_bytes) / (2.0 * compute_seconds) / 1e9;
  auto device = MakeCpuDevice(size_t{64} << 20, gbps);
  auto trainer = Trainer::Create(*device, TinyConfig(shape), o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  (*trainer)->InitializeRandom(3);
  // Two warm-up steps (first touch of the arena and the BLAS buffers); the
  // timeline keeps the last step only.
  absl::StatusOr<StepReport> r;
  for (int step = 0; step < 3; ++step) {
    r = (*trainer)->Step(batches.InputPointers(step, 1), batches.TargetPointers(step, 1));
    ASSERT_TRUE(r.ok()) << r.status();
  }

  std::map<int, Span> compute, copy_in;
  for (const TimelineSpan& s : device->timeline().Spans()) {
    if (s.label.rfind("layer.fwd.", 0) != 0) continue;
    if (s.kind == SpanKind::kCompute) compute[s.layer] = {s.begin_ns, s.end_ns};
    if (s.kind == SpanKind::kCopyIn) copy_in[s.layer] = {s.begin_ns, s.end_ns};
  }
  ASSERT_EQ(compute.size(), 6u);
  ASSERT_EQ(copy_in.size(), 6u);
  const int64_t min_copy_ns = static_cast<int64_t>(static_cast<double>(layer_bytes) / gbps);
  int overlapping = 0;
  for (int i = 0; i + 1 < shape.layers; ++i) {
    const Span& c = compute[i];
    const Span& next = copy_in[i + 1];
    // The copy of layer i+1 started before layer i finished computing: the order the executor
    // guarantees (the copy waits only for the slot layer i-1 freed, layer i's compute for its
    // own copy), whatever the machine's speed.
    EXPECT_LT(next.begin, c.end) << "layer " << i;
    // Still running once layer i started: true unless the compute thread was held off the CPU
    // longer than a whole copy (a loaded machine can do that to one layer, e.g. behind the
    // embedding), so counted rather than required of every layer.
    if (next.end > c.begin) ++overlapping;
    // The throttle is in force: no copy beats the emulated link.
    EXPECT_GE(next.end - next.begin, min_copy_ns) << "layer " << i + 1;
  }
  EXPECT_GT(overlapping, 0) << "no layer's next copy ran during its compute";
  EXPECT_GT(r->total_stall_seconds, 0.0);  // a copy-bound step must wait for weights

  const nlohmann::json trace = nlohmann::json::parse(device->timeline().ToChromeTraceJson());
  std::set<std::string> threads;
  for (const auto& event : trace["traceEvents"]) {
    if (event["ph"] == "M" && event["name"] == "thread_name") {
      threads.insert(event["args"]["name"].get<std::string>());
    }
  }
  EXPECT_TRUE(threads.count("copy_in") && threads.count("compute") && threads.count("copy_out"));
}

}  // namespace
}  // namespace megatrain::engine
