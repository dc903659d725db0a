// DeviceSpanRecorder: the FIFO of timing-event spans and their resolution to
// host time against the stream's anchor (protocol in the header).
#include "engine/device/device_span_recorder.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace megatrain::engine {

DeviceSpanRecorder::DeviceSpanRecorder(std::string stream, Timeline* timeline, TimingEvents* events)
    : stream_(std::move(stream)), timeline_(timeline), events_(events) {}

DeviceSpanRecorder::~DeviceSpanRecorder() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Pending& span : pending_) Drop(span);
  pending_.clear();
  if (anchor_ >= 0) events_->Release(anchor_);
}

void DeviceSpanRecorder::Drop(const Pending& span) {
  events_->Release(span.begin);
  events_->Release(span.end);
}

std::optional<int> DeviceSpanRecorder::Begin() {
  if (!timeline_->enabled()) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  if (anchor_ < 0) return std::nullopt;
  if (pending_.size() >= kMaxPending) {
    PollLocked();
    if (pending_.size() >= kMaxPending) {
      ++dropped_;
      return std::nullopt;
    }
  }
  absl::StatusOr<int> id = events_->Acquire();
  if (!id.ok()) return std::nullopt;
  if (!events_->Record(*id).ok()) {
    events_->Release(*id);
    return std::nullopt;
  }
  return *id;
}

void DeviceSpanRecorder::End(std::optional<int> begin, const TimelineTag& tag, SpanKind kind) {
  if (!begin.has_value()) return;
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<int> end = events_->Acquire();
  if (!end.ok()) {
    events_->Release(*begin);
    return;
  }
  if (!events_->Record(*end).ok()) {
    events_->Release(*begin);
    events_->Release(*end);
    return;
  }
  pending_.push_back(Pending{tag.label, tag.layer, kind, *begin, *end});
  PollLocked();
}

void DeviceSpanRecorder::Poll() {
  std::lock_guard<std::mutex> lock(mu_);
  PollLocked();
}

void DeviceSpanRecorder::PollLocked() {
  while (!pending_.empty()) {
    const Pending& span = pending_.front();
    const TimingEvents::State end_state = events_->Query(span.end);
    if (end_state == TimingEvents::State::kPending) return;  // stream order: the rest are behind
    bool added = false;
    if (end_state == TimingEvents::State::kDone && anchor_ >= 0) {
      absl::StatusOr<double> begin_ms = events_->ElapsedMs(anchor_, span.begin);
      absl::StatusOr<double> end_ms = events_->ElapsedMs(anchor_, span.end);
      if (begin_ms.ok() && end_ms.ok()) {
        const int64_t begin_ns =
            anchor_host_ns_ + static_cast<int64_t>(std::llround(std::max(0.0, *begin_ms) * 1e6));
        const int64_t end_ns = std::max<int64_t>(
            begin_ns,
            anchor_host_ns_ + static_cast<int64_t>(std::llround(std::max(0.0, *end_ms) * 1e6)));
        timeline_->Add(TimelineSpan{stream_, span.kind, span.label, span.layer, begin_ns, end_ns});
        added = true;
      }
    }
    if (!added) ++dropped_;
    Drop(span);
    pending_.pop_front();
  }
}

void DeviceSpanRecorder::OnDrained() {
  int anchor = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    PollLocked();
    // Work enqueued since the drain (another thread) keeps spans pending: they
    // resolve against the current anchor, so it stays until they have.
    if (!pending_.empty()) return;
    absl::StatusOr<int> acquired = events_->Acquire();
    if (!acquired.ok()) return;  // keep the old anchor
    if (!events_->Record(*acquired).ok()) {
      events_->Release(*acquired);
      return;
    }
    anchor = *acquired;
  }
  // Waited for outside the lock: work another thread enqueued behind the
  // anchor may itself wait on an event that thread records after an End().
  if (!events_->WaitFor(anchor).ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    events_->Release(anchor);
    return;
  }
  const int64_t host_ns = timeline_->NowNs();
  std::lock_guard<std::mutex> lock(mu_);
  if (anchor_ >= 0) events_->Release(anchor_);
  anchor_ = anchor;
  anchor_host_ns_ = host_ns;
}

size_t DeviceSpanRecorder::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.size();
}

int64_t DeviceSpanRecorder::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

bool DeviceSpanRecorder::anchored() const {
  std::lock_guard<std::mutex> lock(mu_);
  return anchor_ >= 0;
}

}  // namespace megatrain::engine
