// Timeline: span storage and Chrome trace export.
#include "engine/device/timeline.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <tuple>
#include <utility>

namespace megatrain::engine {

std::string_view SpanKindName(SpanKind kind) {
  switch (kind) {
    case SpanKind::kCopyIn:
      return "copy_in";
    case SpanKind::kCompute:
      return "compute";
    case SpanKind::kCopyOut:
      return "copy_out";
    case SpanKind::kUpdate:
      return "update";
    case SpanKind::kWait:
      return "wait";
    case SpanKind::kOther:
      return "other";
  }
  return "other";
}

Timeline::Timeline() : origin_(std::chrono::steady_clock::now()) {}

int64_t Timeline::NowNs() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              origin_)
      .count();
}

void Timeline::RegisterStream(std::string_view stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (std::find(streams_.begin(), streams_.end(), stream) == streams_.end()) {
    streams_.emplace_back(stream);
  }
}

void Timeline::Add(TimelineSpan span) {
  std::lock_guard<std::mutex> lock(mu_);
  spans_.push_back(std::move(span));
}

void Timeline::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  spans_.clear();
}

std::vector<TimelineSpan> Timeline::Spans() const {
  std::vector<TimelineSpan> spans;
  {
    std::lock_guard<std::mutex> lock(mu_);
    spans = spans_;
  }
  std::sort(spans.begin(), spans.end(), [](const TimelineSpan& a, const TimelineSpan& b) {
    return std::tie(a.begin_ns, a.stream, a.end_ns) < std::tie(b.begin_ns, b.stream, b.end_ns);
  });
  return spans;
}

int64_t Timeline::TotalNs(std::string_view stream, SpanKind kind) const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t total = 0;
  for (const TimelineSpan& span : spans_) {
    if (span.kind == kind && span.stream == stream) total += span.end_ns - span.begin_ns;
  }
  return total;
}

std::string Timeline::ToChromeTraceJson() const {
  const std::vector<TimelineSpan> spans = Spans();
  std::vector<std::string> streams;
  {
    std::lock_guard<std::mutex> lock(mu_);
    streams = streams_;
  }
  // Streams that recorded spans without registering still get a track, after the registered ones.
  for (const TimelineSpan& span : spans) {
    if (std::find(streams.begin(), streams.end(), span.stream) == streams.end()) {
      streams.push_back(span.stream);
    }
  }
  auto tid_of = [&streams](const std::string& stream) {
    return static_cast<int>(std::find(streams.begin(), streams.end(), stream) - streams.begin()) +
           1;
  };

  nlohmann::json events = nlohmann::json::array();
  for (size_t i = 0; i < streams.size(); ++i) {
    const int tid = static_cast<int>(i) + 1;
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 1},
                      {"tid", tid},
                      {"args", {{"name", streams[i]}}}});
    events.push_back({{"name", "thread_sort_index"},
                      {"ph", "M"},
                      {"pid", 1},
                      {"tid", tid},
                      {"args", {{"sort_index", tid}}}});
  }
  for (const TimelineSpan& span : spans) {
    const std::string_view kind = SpanKindName(span.kind);
    nlohmann::json event = {
        {"name", span.label.empty() ? std::string(kind) : span.label},
        {"cat", std::string(kind)},
        {"ph", "X"},
        {"pid", 1},
        {"tid", tid_of(span.stream)},
        {"ts", static_cast<double>(span.begin_ns) / 1e3},
        {"dur", static_cast<double>(span.end_ns - span.begin_ns) / 1e3},
        {"args", {{"kind", std::string(kind)}, {"layer", span.layer}, {"stream", span.stream}}},
    };
    events.push_back(std::move(event));
  }
  nlohmann::json trace = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  return trace.dump();
}

}  // namespace megatrain::engine
