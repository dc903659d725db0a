// DeviceSpanRecorder over a fake event clock: spans resolve only once their
// end event completed, in stream order, at anchor + elapsed; failed events
// drop their span; nothing is recorded while the timeline is off or before an
// anchor; events are reused; re-anchoring waits for pending spans. Runs on the CPU.
#include "engine/device/device_span_recorder.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

namespace megatrain::engine {
namespace {

// Events complete when the test says so, at device times the test sets.
class FakeEvents final : public TimingEvents {
 public:
  struct Event {
    bool recorded = false;
    State state = State::kPending;
    double device_ms = 0;
  };

  absl::StatusOr<int> Acquire() override {
    if (!free_.empty()) {
      const int id = free_.back();
      free_.pop_back();
      events_[id] = Event{};
      ++in_use;
      return id;
    }
    const int id = next_++;
    events_[id] = Event{};
    ++in_use;
    ++created;
    return id;
  }
  void Release(int id) override {
    free_.push_back(id);
    --in_use;
  }
  absl::Status Record(int id) override {
    events_[id].recorded = true;
    recorded_order.push_back(id);
    return absl::OkStatus();
  }
  State Query(int id) override { return events_[id].state; }
  absl::StatusOr<double> ElapsedMs(int from, int to) override {
    return events_[to].device_ms - events_[from].device_ms;
  }
  absl::Status WaitFor(int id) override {
    Complete(id, now_ms);
    return absl::OkStatus();
  }

  void Complete(int id, double device_ms) {
    events_[id].state = State::kDone;
    events_[id].device_ms = device_ms;
  }
  void Fail(int id) { events_[id].state = State::kFailed; }

  double now_ms = 0;  // device time the anchor completes at
  int created = 0;
  int in_use = 0;
  std::vector<int> recorded_order;

 private:
  std::map<int, Event> events_;
  std::vector<int> free_;
  int next_ = 0;
};

TimelineTag Tag(const char* label, int layer) {
  return TimelineTag{SpanKind::kOther, label, layer};
}

TEST(DeviceSpanRecorderTest, NothingRecordedWhileTimelineOffOrUnanchored) {
  Timeline timeline;
  FakeEvents events;
  DeviceSpanRecorder recorder("compute", &timeline, &events);
  timeline.set_enabled(true);
  EXPECT_FALSE(recorder.Begin().has_value()) << "no anchor yet";
  recorder.OnDrained();
  ASSERT_TRUE(recorder.anchored());
  timeline.set_enabled(false);
  EXPECT_FALSE(recorder.Begin().has_value()) << "timeline off";
  EXPECT_EQ(events.in_use, 1);  // the anchor only
}

TEST(DeviceSpanRecorderTest, SpansResolveInStreamOrderAtAnchorPlusElapsed) {
  Timeline timeline;
  FakeEvents events;
  DeviceSpanRecorder recorder("compute", &timeline, &events);
  events.now_ms = 100.0;
  recorder.OnDrained();
  timeline.set_enabled(true);

  std::optional<int> b1 = recorder.Begin();
  ASSERT_TRUE(b1.has_value());
  recorder.End(b1, Tag("layer 0 fwd", 0), SpanKind::kCompute);
  std::optional<int> b2 = recorder.Begin();
  recorder.End(b2, Tag("copy", 1), SpanKind::kCopyIn);
  ASSERT_EQ(recorder.pending(), 2u);
  const int e1 = events.recorded_order[2], e2 = events.recorded_order[4];

  // The second span's end done before the first's: nothing resolves (FIFO).
  events.Complete(*b1, 100.5);
  events.Complete(*b2, 101.0);
  events.Complete(e2, 103.0);
  recorder.Poll();
  EXPECT_TRUE(timeline.Spans().empty());

  events.Complete(e1, 100.75);
  recorder.Poll();
  EXPECT_EQ(recorder.pending(), 0u);
  const std::vector<TimelineSpan> spans = timeline.Spans();
  ASSERT_EQ(spans.size(), 2u);
  // Anchor at device 100 ms = its host time; the spans are offsets from it.
  const int64_t anchor_ns = spans[0].begin_ns - 500000;
  EXPECT_EQ(spans[0].stream, "compute");
  EXPECT_EQ(spans[0].kind, SpanKind::kCompute);
  EXPECT_EQ(spans[0].label, "layer 0 fwd");
  EXPECT_EQ(spans[0].layer, 0);
  EXPECT_EQ(spans[0].end_ns - spans[0].begin_ns, 250000);
  EXPECT_EQ(spans[1].kind, SpanKind::kCopyIn);
  EXPECT_EQ(spans[1].begin_ns, anchor_ns + 1000000);
  EXPECT_EQ(spans[1].end_ns, anchor_ns + 3000000);
  EXPECT_GE(anchor_ns, 0);
  EXPECT_EQ(events.in_use, 1);  // span events released, the anchor kept
}

TEST(DeviceSpanRecorderTest, FailedEventsDropTheirSpanAndEventsAreReused) {
  Timeline timeline;
  FakeEvents events;
  DeviceSpanRecorder recorder("copy_in", &timeline, &events);
  recorder.OnDrained();
  timeline.set_enabled(true);
  std::optional<int> b = recorder.Begin();
  recorder.End(b, Tag("x", -1), SpanKind::kCopyIn);
  events.Fail(events.recorded_order.back());
  recorder.Poll();
  EXPECT_TRUE(timeline.Spans().empty());
  EXPECT_EQ(recorder.dropped(), 1);
  const int created = events.created;
  for (int i = 0; i < 10; ++i) {
    std::optional<int> begin = recorder.Begin();
    events.Complete(*begin, 1.0);
    recorder.End(begin, Tag("y", -1), SpanKind::kCopyIn);
    events.Complete(events.recorded_order.back(), 2.0);
    recorder.Poll();
  }
  EXPECT_EQ(timeline.Spans().size(), 10u);
  EXPECT_EQ(events.created, created) << "released events are reused";
}

TEST(DeviceSpanRecorderTest, SpanBegunWhileEnabledIsKeptAfterRecordingStops) {
  Timeline timeline;
  FakeEvents events;
  DeviceSpanRecorder recorder("compute", &timeline, &events);
  recorder.OnDrained();
  timeline.set_enabled(true);
  std::optional<int> b = recorder.Begin();
  recorder.End(b, Tag("last", 3), SpanKind::kCompute);
  timeline.set_enabled(false);
  events.Complete(*b, 1.0);
  events.Complete(events.recorded_order.back(), 2.0);
  recorder.OnDrained();  // the stream's Synchronize
  ASSERT_EQ(timeline.Spans().size(), 1u);
  EXPECT_EQ(timeline.Spans()[0].layer, 3);
}

TEST(DeviceSpanRecorderTest, ReanchorsOnlyWithNothingPending) {
  Timeline timeline;
  FakeEvents events;
  DeviceSpanRecorder recorder("compute", &timeline, &events);
  recorder.OnDrained();
  const int first_anchor = events.recorded_order.back();
  timeline.set_enabled(true);
  std::optional<int> b = recorder.Begin();
  recorder.End(b, Tag("racing", -1), SpanKind::kCompute);
  const size_t records = events.recorded_order.size();
  recorder.OnDrained();  // its end has not completed: the anchor stays
  EXPECT_EQ(events.recorded_order.size(), records);
  events.Complete(*b, 1.0);
  events.Complete(events.recorded_order.back(), 2.0);
  recorder.OnDrained();
  EXPECT_EQ(timeline.Spans().size(), 1u);
  EXPECT_NE(events.recorded_order.back(), first_anchor);
  EXPECT_EQ(events.in_use, 1);
}

}  // namespace
}  // namespace megatrain::engine
