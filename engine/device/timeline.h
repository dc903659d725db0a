// Timeline: thread-safe collector of per-stream operation spans, exportable as a Chrome trace.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace megatrain::engine {

// What a stream operation does, as seen by the overlap metrics.
enum class SpanKind { kCopyIn, kCompute, kCopyOut, kUpdate, kWait, kOther };

// "copy_in", "compute", "copy_out", "update", "wait", "other".
std::string_view SpanKindName(SpanKind kind);

// Caller-supplied description of an enqueued operation. Cheap to leave empty.
struct TimelineTag {
  SpanKind kind = SpanKind::kOther;
  std::string label;
  int layer = -1;  // -1: not tied to a layer
};

// One executed operation on one stream. Times are nanoseconds since the Timeline was created.
struct TimelineSpan {
  std::string stream;
  SpanKind kind = SpanKind::kOther;
  std::string label;
  int layer = -1;
  int64_t begin_ns = 0;
  int64_t end_ns = 0;
};

// Streams add spans only while enabled() (off by default: measuring costs two clock reads per op).
class Timeline {
 public:
  Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  void set_enabled(bool enabled) { enabled_.store(enabled, std::memory_order_relaxed); }
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

  // Nanoseconds since construction on the steady clock.
  int64_t NowNs() const;

  // Gives the stream a track (Chrome "tid") in creation order; idempotent.
  void RegisterStream(std::string_view stream);

  void Add(TimelineSpan span);
  void Clear();

  // All spans so far, ordered by (begin_ns, stream, end_ns).
  std::vector<TimelineSpan> Spans() const;

  // Sum of (end_ns - begin_ns) over the spans of `stream` with `kind`.
  int64_t TotalNs(std::string_view stream, SpanKind kind) const;

  // Chrome trace event format: {"traceEvents":[...]} with one "X" event per span (ts/dur in
  // microseconds, tid = stream track, args.layer) plus thread_name metadata per stream; opens in
  // chrome://tracing and Perfetto.
  std::string ToChromeTraceJson() const;

 private:
  const std::chrono::steady_clock::time_point origin_;
  std::atomic<bool> enabled_{false};
  mutable std::mutex mu_;
  std::vector<std::string> streams_;  // index = tid - 1
  std::vector<TimelineSpan> spans_;
};

}  // namespace megatrain::engine
