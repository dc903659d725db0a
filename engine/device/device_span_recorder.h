// DeviceSpanRecorder: timeline spans of work a device runs asynchronously
// (copies, waits, kernels on a CUDA stream), timed by device events and
// resolved to the Timeline's host clock later, never blocking the stream.
// Host-only over the TimingEvents interface: CudaStream implements it with
// cudaEvent_t pairs; device_span_recorder_test with a fake clock.
//
// Protocol:
//  1. Begin() records a begin event on the stream before the op is enqueued,
//     End() an end event after it and queues the span (FIFO, stream order).
//  2. Poll() (on every End and at Synchronize) resolves spans from the front
//     whose end event has completed: t = anchor_host_ns + elapsed(anchor, ev).
//     A span behind one still running waits; a failed event drops its span.
//  3. The anchor is an event recorded on a drained stream and waited for
//     (outside the lock, so no enqueuing thread is held while the GPU runs);
//     its host time is read just after (error: the wake-up latency).
//     OnDrained() (after the stream's Synchronize) resolves everything with
//     the old anchor, then re-anchors (only with nothing pending), so elapsed
//     times stay short: float milliseconds keep ~1 us precision for minutes.
//     Negative elapsed times (a begin recorded before a racing re-anchor)
//     clamp to the anchor.
//  4. Spans are recorded while the Timeline is enabled at Begin; a span begun
//     while enabled is added even if recording stops before it resolves.
//  5. At most kMaxPending spans wait; past that new ones are dropped (counted).
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/device/timeline.h"

namespace megatrain::engine {

// Timing events of one stream, named by small integer ids.
class TimingEvents {
 public:
  enum class State { kPending, kDone, kFailed };
  virtual ~TimingEvents() = default;
  virtual absl::StatusOr<int> Acquire() = 0;  // a free event (created or reused)
  virtual void Release(int id) = 0;
  virtual absl::Status Record(int id) = 0;  // on the stream, after what is enqueued so far
  virtual State Query(int id) = 0;
  virtual absl::StatusOr<double> ElapsedMs(int from, int to) = 0;  // both done
  virtual absl::Status WaitFor(int id) = 0;                        // blocks the caller
};

class DeviceSpanRecorder {
 public:
  static constexpr size_t kMaxPending = 16384;

  // `timeline` and `events` outlive the recorder.
  DeviceSpanRecorder(std::string stream, Timeline* timeline, TimingEvents* events);
  ~DeviceSpanRecorder();  // releases the events still held (the stream must be drained)
  DeviceSpanRecorder(const DeviceSpanRecorder&) = delete;
  DeviceSpanRecorder& operator=(const DeviceSpanRecorder&) = delete;

  // The begin event's id, or nothing when not recording (timeline off, no anchor, full).
  std::optional<int> Begin();
  // Queues the span opened by `begin` (no-op for nothing), then polls.
  void End(std::optional<int> begin, const TimelineTag& tag, SpanKind kind);
  // Resolves the completed spans at the front of the queue.
  void Poll();
  // Call with the stream drained: resolves every span, then re-anchors.
  void OnDrained();

  size_t pending() const;
  int64_t dropped() const;
  bool anchored() const;

 private:
  struct Pending {
    std::string label;
    int layer = -1;
    SpanKind kind = SpanKind::kOther;
    int begin = -1;
    int end = -1;
  };
  void PollLocked();
  void Drop(const Pending& span);

  const std::string stream_;
  Timeline* const timeline_;
  TimingEvents* const events_;
  mutable std::mutex mu_;
  std::deque<Pending> pending_;
  int anchor_ = -1;  // event id; -1: none
  int64_t anchor_host_ns_ = 0;
  int64_t dropped_ = 0;
};

}  // namespace megatrain::engine
