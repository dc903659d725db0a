// CpuStream: a Stream of the CPU device, one worker thread executing its queue in order.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "engine/device/cpu_device_state.h"
#include "engine/device/cpu_event.h"
#include "engine/device/device.h"

namespace megatrain::engine {

class CpuStream final : public Stream {
 public:
  CpuStream(std::string name, std::shared_ptr<CpuDeviceState> device);
  ~CpuStream() override;  // drains the queue, then joins the worker

  std::string_view name() const override { return name_; }
  void CopyHostToDevice(void* dst_device, const void* src_host, size_t bytes,
                        TimelineTag tag) override;
  void CopyDeviceToHost(void* dst_host, const void* src_device, size_t bytes,
                        TimelineTag tag) override;
  void CopyDeviceToDevice(void* dst_device, const void* src_device, size_t bytes,
                          TimelineTag tag) override;
  void EnqueueHostTask(std::function<void()> fn, TimelineTag tag) override;
  void EnqueueFallibleHostTask(std::function<absl::Status()> fn, TimelineTag tag) override;
  void RecordEvent(Event& event) override;
  void WaitEvent(const Event& event, TimelineTag tag) override;
  absl::Status Synchronize() override;
  absl::Status Failure() override;

 private:
  enum class OpKind { kWork, kRecord, kWait };
  struct Op {
    OpKind kind = OpKind::kWork;
    TimelineTag tag;
    std::function<absl::Status()> work;    // kWork
    std::shared_ptr<CpuEventState> event;  // kRecord, kWait
    uint64_t generation = 0;               // kRecord, kWait
  };
  static Op WorkOp(TimelineTag tag, std::function<absl::Status()> work) {
    Op op;
    op.tag = std::move(tag);
    op.work = std::move(work);
    return op;
  }

  void Enqueue(Op op);
  void WorkerLoop();
  void Execute(Op& op);
  bool Skipping();
  void AddSpan(const TimelineTag& tag, SpanKind kind, int64_t begin_ns);

  const std::string name_;
  const std::shared_ptr<CpuDeviceState> device_;

  std::mutex mu_;
  std::condition_variable work_available_;
  std::condition_variable idle_;
  std::deque<Op> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  absl::Status error_;  // sticky, this stream only

  std::thread worker_;  // last: starts after everything above is constructed
};

}  // namespace megatrain::engine
