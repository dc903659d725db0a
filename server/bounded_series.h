// BoundedSeries: a per-step series that keeps at most `capacity` samples whatever the run's
// length. Samples are kept every `stride` steps; when the series fills, every second sample goes
// and the stride doubles, so the kept samples stay evenly spaced over the whole run. The newest
// sample is always kept apart, so the series ends at the latest step. A step at or before the
// last kept one (a run that continued from a checkpoint redoes steps) first drops the samples
// from that step on.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace megatrain::server {

// `Sample` has `uint64_t step() const`.
template <typename Sample>
class BoundedSeries {
 public:
  explicit BoundedSeries(size_t capacity) : capacity_(std::max<size_t>(capacity, 2)) {}

  void Add(const Sample& sample) {
    while (!kept_.empty() && kept_.back().step() >= sample.step()) kept_.pop_back();
    if (latest_.has_value() && latest_->step() >= sample.step()) latest_.reset();
    if (kept_.empty() || sample.step() >= kept_.back().step() + stride_) {
      kept_.push_back(sample);
      if (kept_.size() >= capacity_) Halve();
      latest_.reset();
      if (kept_.back().step() != sample.step()) latest_ = sample;  // halving dropped it
    } else {
      latest_ = sample;
    }
  }

  // Oldest first; the newest sample added is last.
  std::vector<Sample> Samples() const {
    std::vector<Sample> out = kept_;
    if (latest_.has_value()) out.push_back(*latest_);
    return out;
  }
  // The newest sample added; null when empty.
  const Sample* Last() const {
    if (latest_.has_value()) return &*latest_;
    return kept_.empty() ? nullptr : &kept_.back();
  }
  size_t size() const { return kept_.size() + (latest_.has_value() ? 1 : 0); }
  uint64_t stride() const { return stride_; }
  size_t capacity() const { return capacity_; }

 private:
  // Keeps the samples at even positions (the first one stays) and doubles the stride.
  void Halve() {
    size_t out = 0;
    for (size_t i = 0; i < kept_.size(); i += 2) kept_[out++] = kept_[i];
    kept_.resize(out);
    stride_ *= 2;
  }

  const size_t capacity_;  // kept samples plus the newest one stay below this
  uint64_t stride_ = 1;
  std::vector<Sample> kept_;
  std::optional<Sample> latest_;  // newer than kept_.back() and not kept
};

}  // namespace megatrain::server
