// CpuStream: the queue, the worker loop and the operations it executes.
#include "engine/device/cpu_stream.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/fatal.h"

namespace megatrain::engine {
namespace {

const CpuEvent& AsCpuEvent(const Event& event, std::string_view stream) {
  const CpuEvent* cpu_event = dynamic_cast<const CpuEvent*>(&event);
  if (cpu_event == nullptr) {
    internal::DieBecause(absl::StrCat("stream '", std::string(stream),
                                      "' was given an event from another kind of device"));
  }
  return *cpu_event;
}

std::string RangeMessage(std::string_view op, std::string_view what, const void* p, size_t bytes) {
  return absl::StrCat(std::string(op), ": ", std::string(what), " [",
                      absl::Hex(reinterpret_cast<uintptr_t>(p)), ", +", bytes,
                      ") is not inside the device arena");
}

}  // namespace

CpuStream::CpuStream(std::string name, std::shared_ptr<CpuDeviceState> device)
    : name_(std::move(name)), device_(std::move(device)), worker_([this] { WorkerLoop(); }) {
  device_->timeline().RegisterStream(name_);
}

CpuStream::~CpuStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_available_.notify_one();
  worker_.join();
}

void CpuStream::Enqueue(Op op) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(op));
  }
  work_available_.notify_one();
}

void CpuStream::WorkerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    work_available_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping and drained
    Op op = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    Execute(op);
    op = Op();  // release captured state before reporting idle
    lock.lock();
    busy_ = false;
    if (queue_.empty()) idle_.notify_all();
  }
}

bool CpuStream::Skipping() {
  if (!device_->fault().ok()) return true;
  std::lock_guard<std::mutex> lock(mu_);
  return !error_.ok();
}

void CpuStream::AddSpan(const TimelineTag& tag, SpanKind kind, int64_t begin_ns) {
  Timeline& timeline = device_->timeline();
  timeline.Add(TimelineSpan{name_, kind, tag.label, tag.layer, begin_ns, timeline.NowNs()});
}

void CpuStream::Execute(Op& op) {
  Timeline& timeline = device_->timeline();
  switch (op.kind) {
    case OpKind::kRecord:
      op.event->Complete(op.generation);
      return;
    case OpKind::kWait: {
      const bool recording = timeline.enabled();
      const int64_t begin_ns = recording ? timeline.NowNs() : 0;
      op.event->WaitFor(op.generation);
      if (recording) AddSpan(op.tag, SpanKind::kWait, begin_ns);
      return;
    }
    case OpKind::kWork: {
      if (Skipping()) return;
      const bool recording = timeline.enabled();
      const int64_t begin_ns = recording ? timeline.NowNs() : 0;
      absl::Status status = op.work();
      if (recording) AddSpan(op.tag, op.tag.kind, begin_ns);
      if (!status.ok()) {
        std::lock_guard<std::mutex> lock(mu_);
        if (error_.ok()) {
          error_ =
              absl::Status(status.code(), absl::StrCat("stream '", name_, "': ", status.message()));
        }
      }
      return;
    }
  }
}

void CpuStream::CopyHostToDevice(void* dst_device, const void* src_host, size_t bytes,
                                 TimelineTag tag) {
  std::shared_ptr<CpuDeviceState> device = device_;
  Enqueue(WorkOp(std::move(tag), [device, dst_device, src_host, bytes]() -> absl::Status {
    if (!device->InArena(dst_device, bytes)) {
      return absl::InvalidArgumentError(
          RangeMessage("CopyHostToDevice", "destination", dst_device, bytes));
    }
    device->host_to_device().Copy(dst_device, src_host, bytes);
    return absl::OkStatus();
  }));
}

void CpuStream::CopyDeviceToHost(void* dst_host, const void* src_device, size_t bytes,
                                 TimelineTag tag) {
  std::shared_ptr<CpuDeviceState> device = device_;
  Enqueue(WorkOp(std::move(tag), [device, dst_host, src_device, bytes]() -> absl::Status {
    if (!device->InArena(src_device, bytes)) {
      return absl::InvalidArgumentError(
          RangeMessage("CopyDeviceToHost", "source", src_device, bytes));
    }
    device->device_to_host().Copy(dst_host, src_device, bytes);
    return absl::OkStatus();
  }));
}

void CpuStream::CopyDeviceToDevice(void* dst_device, const void* src_device, size_t bytes,
                                   TimelineTag tag) {
  std::shared_ptr<CpuDeviceState> device = device_;
  Enqueue(WorkOp(std::move(tag), [device, dst_device, src_device, bytes]() -> absl::Status {
    if (!device->InArena(dst_device, bytes)) {
      return absl::InvalidArgumentError(
          RangeMessage("CopyDeviceToDevice", "destination", dst_device, bytes));
    }
    if (!device->InArena(src_device, bytes)) {
      return absl::InvalidArgumentError(
          RangeMessage("CopyDeviceToDevice", "source", src_device, bytes));
    }
    // Device memory has no link to emulate; ranges may overlap as with cudaMemcpy's
    // undefined case, memmove keeps it defined here.
    if (bytes > 0) std::memmove(dst_device, src_device, bytes);
    return absl::OkStatus();
  }));
}

void CpuStream::EnqueueHostTask(std::function<void()> fn, TimelineTag tag) {
  Enqueue(WorkOp(std::move(tag), [fn = std::move(fn)]() -> absl::Status {
    fn();
    return absl::OkStatus();
  }));
}

void CpuStream::EnqueueFallibleHostTask(std::function<absl::Status()> fn, TimelineTag tag) {
  Enqueue(WorkOp(std::move(tag), std::move(fn)));
}

void CpuStream::RecordEvent(Event& event) {
  const std::shared_ptr<CpuEventState>& state = AsCpuEvent(event, name_).state();
  Op op;
  op.kind = OpKind::kRecord;
  op.event = state;
  op.generation = state->BeginRecord();
  Enqueue(std::move(op));
}

void CpuStream::WaitEvent(const Event& event, TimelineTag tag) {
  const std::shared_ptr<CpuEventState>& state = AsCpuEvent(event, name_).state();
  const uint64_t generation = state->latest_recorded();
  if (generation == 0) return;  // never recorded: nothing to wait for
  Op op;
  op.kind = OpKind::kWait;
  op.tag = std::move(tag);
  op.event = state;
  op.generation = generation;
  Enqueue(std::move(op));
}

absl::Status CpuStream::Failure() {
  absl::Status fault = device_->fault();
  if (!fault.ok()) return fault;
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

absl::Status CpuStream::Synchronize() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [this] { return queue_.empty() && !busy_; });
  absl::Status fault = device_->fault();
  if (!fault.ok()) return fault;
  return error_;
}

}  // namespace megatrain::engine
