// Device, Stream, Event: the interface the streaming executor runs on (CPU emulation or CUDA).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/device/arena_allocator.h"
#include "engine/device/device_buffer.h"
#include "engine/device/device_options.h"
#include "engine/device/pinned_host_buffer.h"
#include "engine/device/pinned_memory_pool.h"
#include "engine/device/timeline.h"

namespace megatrain::engine {

// A point in a stream's queue, with CUDA event semantics: RecordEvent captures "everything
// enqueued on that stream so far"; recording again moves the event to the new point; waiting on
// a never-recorded event is a no-op. Re-record an event on one stream at a time.
class Event {
 public:
  virtual ~Event() = default;
  // Blocks the caller until the most recently recorded point has completed (OK at once if never
  // recorded). Returns the device's sticky error, if any.
  virtual absl::Status Synchronize() = 0;
  // Whether the most recently recorded point has completed (true if never recorded).
  virtual bool Query() = 0;
};

// An ordered queue of work. Enqueue calls never block on the work itself; failures are sticky and
// surface in Synchronize() (CUDA's model): once an operation fails, later data operations on the
// stream (or on every stream, for a device fault) are skipped. Event record/wait keep working
// after a failure so no stream waits forever. A Stream must not outlive its device, and must not
// be used from its own host tasks (Synchronize there would deadlock).
//
// Timeline: while the device's timeline is enabled each executed operation adds a span named by
// its TimelineTag; WaitEvent adds a span of kind kWait covering the time the stream was blocked.
class Stream {
 public:
  virtual ~Stream() = default;  // waits for the queued work, then releases the stream
  virtual std::string_view name() const = 0;

  // Copies between host memory (pinned or not) and device memory (inside the device's arena).
  // The caller keeps both ranges alive and untouched until the copy completes.
  virtual void CopyHostToDevice(void* dst_device, const void* src_host, size_t bytes,
                                TimelineTag tag = {}) = 0;
  virtual void CopyDeviceToHost(void* dst_host, const void* src_device, size_t bytes,
                                TimelineTag tag = {}) = 0;
  virtual void CopyDeviceToDevice(void* dst_device, const void* src_device, size_t bytes,
                                  TimelineTag tag = {}) = 0;

  // Runs `fn` on the host in stream order: on the CPU device on the stream's worker thread (this
  // is how CPU compute kernels run), on CUDA via cudaLaunchHostFunc (fn must make no CUDA calls).
  virtual void EnqueueHostTask(std::function<void()> fn, TimelineTag tag = {}) = 0;
  // As EnqueueHostTask; a non-OK result becomes this stream's sticky error.
  virtual void EnqueueFallibleHostTask(std::function<absl::Status()> fn, TimelineTag tag = {}) = 0;

  // `event` must come from the same device.
  virtual void RecordEvent(Event& event) = 0;
  // Later work on this stream starts only after the event's recorded point has completed. Does not
  // block the caller. The span is recorded with kind kWait whatever tag.kind says.
  virtual void WaitEvent(const Event& event, TimelineTag tag = {}) = 0;

  // Blocks the caller until everything enqueued so far has finished. Returns the device's sticky
  // fault, else this stream's sticky error, else OK.
  virtual absl::Status Synchronize() = 0;

  // What Synchronize would return for the failures known so far, without waiting. Work enqueued
  // after a failure is skipped, host tasks included: a thread that waits for such a task (a
  // staging slot its release would free) must ask this, or it would wait forever.
  virtual absl::Status Failure() = 0;
};

class Device {
 public:
  virtual ~Device() = default;

  virtual std::string_view name() const = 0;
  virtual DeviceKind kind() const = 0;

  // `name` (non-empty) labels the stream in errors and in the timeline.
  virtual absl::StatusOr<std::unique_ptr<Stream>> CreateStream(std::string name) = 0;
  virtual absl::StatusOr<std::unique_ptr<Event>> CreateEvent() = 0;

  // Device memory from the fixed-capacity arena (256-byte aligned). Exceeding the capacity is
  // RESOURCE_EXHAUSTED with requested bytes, tag, capacity, in use and largest free block.
  virtual absl::StatusOr<DeviceBuffer> Allocate(size_t bytes, std::string_view tag) = 0;
  virtual ArenaStats arena_stats() const = 0;
  virtual void ResetPeak() = 0;  // arena peak := current in_use

  // Pinned host memory counted against DeviceOptions::pinned_budget_bytes.
  virtual absl::StatusOr<PinnedHostBuffer> AllocatePinned(size_t bytes) = 0;
  virtual PinnedStats pinned_stats() const = 0;

  // OK while healthy; after a device fault (CUDA sticky error, injected CPU fault) the fault's
  // status, forever.
  virtual absl::Status health() const = 0;

  // Spans of every stream of this device; recording is toggled with timeline().set_enabled().
  virtual Timeline& timeline() = 0;

  // Makes this the calling thread's current device, for work the thread launches outside this
  // interface (kernels, cuBLAS): CUDA keeps one current device per thread, so a process driving
  // several GPUs calls this on each thread before it enqueues for a device. A no-op elsewhere.
  virtual absl::Status MakeCurrent() { return absl::OkStatus(); }
};

}  // namespace megatrain::engine
