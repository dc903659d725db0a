// A stream's host tasks on a thread of their own (see host_task_lane.h).
#include "engine/device/host_task_lane.h"

#include <utility>

namespace megatrain::engine {

HostTaskLane::HostTaskLane(std::atomic<uint32_t>* done_word) : done_(done_word) {
  done_->store(0, std::memory_order_release);
  thread_ = std::thread([this] { Run(); });
}

HostTaskLane::~HostTaskLane() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
  // Whatever was never run: publish the newest ticket so a wait on it cannot hang.
  done_->store(next_ticket_ - 1, std::memory_order_release);
}

uint32_t HostTaskLane::Submit(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mu_);
  queued_.push_back(std::move(task));
  return next_ticket_++;
}

void HostTaskLane::ReleaseNext() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++released_;
  }
  cv_.notify_one();
}

void HostTaskLane::ReleaseNextCallback(void* lane) {
  static_cast<HostTaskLane*>(lane)->ReleaseNext();
}

void HostTaskLane::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stopping_ || (released_ > 0 && !queued_.empty()); });
    if (stopping_) return;
    std::function<void()> task = std::move(queued_.front());
    queued_.pop_front();
    --released_;
    const uint32_t ticket = next_to_run_++;
    lock.unlock();
    task();
    // Release order: the task's writes are visible before the device (or a waiter) sees it done.
    done_->store(ticket, std::memory_order_release);
    lock.lock();
  }
}

}  // namespace megatrain::engine
