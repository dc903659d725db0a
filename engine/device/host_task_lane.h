// HostTaskLane: runs one stream's host tasks on a thread of its own, in stream order, instead of
// on the CUDA driver's callback thread. CUDA runs every stream's host functions on one driver
// thread and may serialise them: a gradient accumulation or an NVMe read there stalls the other
// streams' host work (and must never wait on anything that waits on them). With a lane, the
// stream's host function only releases the next task (it never blocks), and the stream waits on
// a 32-bit word that the lane writes when the task is done (cuStreamWaitValue32).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace megatrain::engine {

class HostTaskLane {
 public:
  // `done_word`: where the ticket of the last finished task is stored (host memory the device
  // can read: pinned and mapped on CUDA). It must outlive the lane; the lane writes 0 first.
  explicit HostTaskLane(std::atomic<uint32_t>* done_word);
  HostTaskLane(const HostTaskLane&) = delete;
  HostTaskLane& operator=(const HostTaskLane&) = delete;
  // Runs no further task and joins the thread; tasks not yet run are dropped with their
  // tickets published, so nothing waiting on the word waits forever. Synchronize the stream
  // first: its host functions hold a pointer to the lane.
  ~HostTaskLane();

  // Queues `task` and returns its ticket (1, 2, ...; wraps modulo 2^32, which the cyclic
  // greater-or-equal of cuStreamWaitValue32 tolerates). It runs once released. One thread
  // enqueues a stream's work (as for any stream), so the k-th release is the k-th ticket.
  // A task must never wait for another stream's progress: its own stream is held in a device
  // wait meanwhile, and streams can share a hardware queue.
  uint32_t Submit(std::function<void()> task);
  // Releases the oldest unreleased task (host functions of one stream run in stream order, so
  // the k-th release is the k-th ticket). Never blocks on a task: safe on the driver thread.
  void ReleaseNext();
  // The C-callable form of ReleaseNext for cudaLaunchHostFunc (`lane` is a HostTaskLane*).
  static void ReleaseNextCallback(void* lane);

  uint32_t last_done() const { return done_->load(std::memory_order_acquire); }

 private:
  void Run();

  std::atomic<uint32_t>* const done_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queued_;  // in ticket order, from next_to_run_
  uint32_t next_ticket_ = 1;
  uint32_t next_to_run_ = 1;
  uint64_t released_ = 0;  // releases not yet consumed by the thread
  bool stopping_ = false;
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace megatrain::engine
