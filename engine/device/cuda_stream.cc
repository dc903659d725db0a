// CudaStream and CudaEvent: every runtime call checked; host tasks on the stream's own thread
// (CudaHostTaskLane), or through cudaLaunchHostFunc on the driver's callback thread.
#include "engine/device/cuda_stream.h"

#include <cuda.h>

#include <cudaTypedefs.h>

#include <atomic>
#include <chrono>
#include <new>
#include <optional>
#include <thread>

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/device/host_task_lane.h"
#include "engine/common/fatal.h"

namespace megatrain::engine {
namespace {

// Owned by the callback once cudaLaunchHostFunc accepted it.
struct HostTask {
  std::function<absl::Status()> fn;
  TimelineTag tag;
  std::string stream;
  std::shared_ptr<CudaDeviceState> device;
  std::shared_ptr<CudaStreamErrors> errors;
};

void CUDART_CB RunHostTask(void* user_data) {
  std::unique_ptr<HostTask> task(static_cast<HostTask*>(user_data));
  if (!task->device->fault().ok() || task->errors->failed()) return;
  Timeline& timeline = task->device->timeline();
  const bool recording = timeline.enabled();
  const int64_t begin_ns = recording ? timeline.NowNs() : 0;
  absl::Status status = task->fn();
  if (recording) {
    timeline.Add(TimelineSpan{task->stream, task->tag.kind, task->tag.label, task->tag.layer,
                              begin_ns, timeline.NowNs()});
  }
  if (!status.ok()) {
    task->errors->Set(absl::Status(
        status.code(), absl::StrCat("stream '", task->stream, "': ", status.message())));
  }
}

}  // namespace

// A HostTaskLane whose done word lives in pinned, mapped host memory, with the driver's
// cuStreamWaitValue32 (not in the runtime API; found through cudaGetDriverEntryPointByVersion,
// so nothing links against libcuda).
class CudaHostTaskLane {
 public:
  // A lane for `stream`, or why there is none (the caller then uses the callback thread).
  // Every failure here is a reason to fall back, never an error of the stream; the runtime's
  // per-thread last error is cleared so no later kernel launch check reports it.
  static absl::StatusOr<std::unique_ptr<CudaHostTaskLane>> Create() {
    absl::StatusOr<std::unique_ptr<CudaHostTaskLane>> lane = TryCreate();
    (void)cudaGetLastError();
    return lane;
  }

  CudaHostTaskLane(const CudaHostTaskLane&) = delete;
  CudaHostTaskLane& operator=(const CudaHostTaskLane&) = delete;
  ~CudaHostTaskLane() {
    lane_.reset();  // before the word it writes goes
    cudaFreeHost(memory_);
  }

  // Queues `task`; the stream releases it once its earlier work is done (a host function that
  // never blocks) and holds its later work until the lane has run it (a wait on the word).
  absl::Status Enqueue(cudaStream_t stream, std::function<void()> task, CudaDeviceState& device) {
    const uint32_t ticket = lane_->Submit(std::move(task));
    if (absl::Status s = device.Check(
            cudaLaunchHostFunc(stream, &HostTaskLane::ReleaseNextCallback, lane_.get()),
            "cudaLaunchHostFunc");
        !s.ok()) {
      return s;  // the stream fails; the queued task is dropped with the lane
    }
    // CUresult and cudaError_t share their codes for what can happen here (700 illegal address,
    // 719 launch failure, ...), so Check classifies a sticky one as a device fault.
    return device.Check(static_cast<cudaError_t>(wait_(reinterpret_cast<CUstream>(stream),
                                                       device_word_, ticket,
                                                       CU_STREAM_WAIT_VALUE_GEQ)),
                        "cuStreamWaitValue32");
  }

 private:
  // The driver's own typedef, so a signature change is a compile error.
  using WaitValue32 = PFN_cuStreamWaitValue32_v11070;
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                std::atomic<uint32_t>::is_always_lock_free);

  static absl::StatusOr<std::unique_ptr<CudaHostTaskLane>> TryCreate() {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &entry, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess || entry == nullptr) {
      return absl::UnimplementedError("the driver has no cuStreamWaitValue32");
    }
    const auto wait = reinterpret_cast<WaitValue32>(entry);
    void* memory = nullptr;
    if (cudaError_t e = cudaHostAlloc(&memory, 64, cudaHostAllocMapped | cudaHostAllocPortable);
        e != cudaSuccess) {
      return absl::UnimplementedError(
          absl::StrCat("cudaHostAlloc(mapped) of the host-task word: ", cudaGetErrorString(e)));
    }
    void* device_word = nullptr;
    if (cudaError_t e = cudaHostGetDevicePointer(&device_word, memory, 0); e != cudaSuccess) {
      cudaFreeHost(memory);
      return absl::UnimplementedError(
          absl::StrCat("cudaHostGetDevicePointer: ", cudaGetErrorString(e)));
    }
    std::unique_ptr<CudaHostTaskLane> lane(
        new CudaHostTaskLane(memory, reinterpret_cast<CUdeviceptr>(device_word), wait));
    if (absl::Status probed = lane->Probe(); !probed.ok()) return probed;
    return lane;
  }

  // That a wait on the word really holds a stream and really sees a store from the host, on a
  // stream of its own (one that never sees the value stays stuck, so it is left behind): a wait
  // for 1 on the word holding 0 must keep an event behind it pending until the host stores 1.
  // The word is 0 again afterwards.
  absl::Status Probe() {
    std::atomic<uint32_t>& word = *static_cast<std::atomic<uint32_t>*>(memory_);
    cudaStream_t probe = nullptr;
    cudaEvent_t passed = nullptr;
    if (cudaStreamCreateWithFlags(&probe, cudaStreamNonBlocking) != cudaSuccess) {
      return absl::UnimplementedError("no stream for the host-task probe");
    }
    if (cudaEventCreateWithFlags(&passed, cudaEventDisableTiming) != cudaSuccess) {
      (void)cudaStreamDestroy(probe);
      return absl::UnimplementedError("no event for the host-task probe");
    }
    if (CUresult r = wait_(reinterpret_cast<CUstream>(probe), device_word_, 1,
                           CU_STREAM_WAIT_VALUE_GEQ);
        r != CUDA_SUCCESS) {
      (void)cudaEventDestroy(passed);
      (void)cudaStreamDestroy(probe);
      return absl::UnimplementedError(absl::StrCat("cuStreamWaitValue32 returned ", r));
    }
    (void)cudaEventRecord(passed, probe);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const bool held = cudaEventQuery(passed) == cudaErrorNotReady;
    word.store(1, std::memory_order_release);
    bool seen = false;
    for (int i = 0; i < 5000 && !seen; ++i) {  // up to ~5 s
      seen = cudaEventQuery(passed) == cudaSuccess;
      if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!seen) {
      // The probe stream waits forever: leave it (and its event) rather than block on them.
      return absl::UnimplementedError("a stream waiting on host memory never saw the host's store");
    }
    (void)cudaEventDestroy(passed);
    (void)cudaStreamDestroy(probe);
    word.store(0, std::memory_order_release);
    if (!held) return absl::UnimplementedError("cuStreamWaitValue32 did not hold the stream");
    return absl::OkStatus();
  }

  CudaHostTaskLane(void* memory, CUdeviceptr device_word, WaitValue32 wait)
      : memory_(memory),
        device_word_(device_word),
        wait_(wait),
        lane_(std::make_unique<HostTaskLane>(new (memory) std::atomic<uint32_t>(0))) {}

  void* const memory_;
  const CUdeviceptr device_word_;
  const WaitValue32 wait_;
  std::unique_ptr<HostTaskLane> lane_;
};

namespace {

const CudaEvent& AsCudaEvent(const Event& event, std::string_view stream) {
  const CudaEvent* cuda_event = dynamic_cast<const CudaEvent*>(&event);
  if (cuda_event == nullptr) {
    internal::DieBecause(absl::StrCat("stream '", std::string(stream),
                                      "' was given an event from another kind of device"));
  }
  return *cuda_event;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaEvent>> CudaEvent::Create(
    std::shared_ptr<CudaDeviceState> device) {
  if (absl::Status current = device->MakeCurrent(); !current.ok()) return current;
  cudaEvent_t event = nullptr;
  if (absl::Status created = device->Check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                                           "cudaEventCreateWithFlags");
      !created.ok()) {
    return created;
  }
  return std::unique_ptr<CudaEvent>(new CudaEvent(std::move(device), event));
}

CudaEvent::CudaEvent(std::shared_ptr<CudaDeviceState> device, cudaEvent_t event)
    : device_(std::move(device)), event_(event) {}

CudaEvent::~CudaEvent() { (void)device_->Check(cudaEventDestroy(event_), "cudaEventDestroy"); }

absl::Status CudaEvent::Synchronize() {
  if (absl::Status synced = device_->Check(cudaEventSynchronize(event_), "cudaEventSynchronize");
      !synced.ok()) {
    return synced;
  }
  return device_->fault();
}

bool CudaEvent::Query() {
  const cudaError_t result = cudaEventQuery(event_);
  if (result == cudaErrorNotReady) return false;
  // Any other error is recorded (a sticky one makes the device unhealthy) and reads as "done"
  // so pollers stop; the error surfaces through health() and Synchronize().
  (void)device_->Check(result, "cudaEventQuery");
  return true;
}

absl::StatusOr<std::unique_ptr<CudaStream>> CudaStream::Create(
    std::string name, std::shared_ptr<CudaDeviceState> device, bool host_task_thread) {
  if (absl::Status current = device->MakeCurrent(); !current.ok()) return current;
  cudaStream_t stream = nullptr;
  if (absl::Status created = device->Check(
          cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      !created.ok()) {
    return created;
  }
  device->timeline().RegisterStream(name);
  std::unique_ptr<CudaStream> created(new CudaStream(std::move(name), std::move(device), stream));
  // The first anchor of the span clock, on the empty stream (a failure only leaves it unanchored:
  // no device spans, never an error of the stream).
  created->spans_->OnDrained();
  if (!host_task_thread) {
    created->lane_status_ = absl::FailedPreconditionError("cuda_host_task_threads is off");
  } else {
    absl::StatusOr<std::unique_ptr<CudaHostTaskLane>> lane = CudaHostTaskLane::Create();
    if (lane.ok()) {
      created->lane_ = *std::move(lane);
    } else {
      created->lane_status_ = lane.status();  // host tasks stay on the driver's callback thread
    }
  }
  return created;
}

CudaStream::CudaStream(std::string name, std::shared_ptr<CudaDeviceState> device,
                       cudaStream_t stream)
    : name_(std::move(name)),
      device_(std::move(device)),
      stream_(stream),
      errors_(std::make_shared<CudaStreamErrors>()),
      timing_(std::make_unique<CudaTimingEvents>(device_, stream_)),
      spans_(std::make_unique<DeviceSpanRecorder>(name_, &device_->timeline(), timing_.get())) {}

CudaStream::~CudaStream() {
  // The lane runs until the stream is drained: the stream's waits need its thread. If the
  // stream did not drain (a fault), host functions may still hold the lane: leave it.
  const absl::Status drained =
      device_->Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  if (drained.ok()) {
    spans_->OnDrained();  // the last spans reach the timeline
    lane_.reset();
  } else {
    (void)lane_.release();
  }
  spans_.reset();
  timing_.reset();
  (void)device_->Check(cudaStreamDestroy(stream_), "cudaStreamDestroy");
}

bool CudaStream::Skipping() { return !device_->fault().ok() || errors_->failed(); }

void CudaStream::Fail(absl::Status status) {
  errors_->Set(
      absl::Status(status.code(), absl::StrCat("stream '", name_, "': ", status.message())));
}

void CudaStream::Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                      std::string_view what, const TimelineTag& tag) {
  if (bytes == 0 || Skipping()) return;
  const std::optional<int> begin = spans_->Begin();
  absl::Status copied = device_->Check(cudaMemcpyAsync(dst, src, bytes, kind, stream_), what);
  spans_->End(begin, tag, tag.kind);
  if (!copied.ok()) Fail(std::move(copied));
}

absl::Status CudaStream::EnqueueTimed(const TimelineTag& tag,
                                      absl::FunctionRef<absl::Status(cudaStream_t)> enqueue) {
  const std::optional<int> begin = spans_->Begin();
  absl::Status status = enqueue(stream_);
  spans_->End(begin, tag, tag.kind);
  return status;
}

void CudaStream::CopyHostToDevice(void* dst_device, const void* src_host, size_t bytes,
                                  TimelineTag tag) {
  Copy(dst_device, src_host, bytes, cudaMemcpyHostToDevice, "cudaMemcpyAsync(HostToDevice)", tag);
}

void CudaStream::CopyDeviceToHost(void* dst_host, const void* src_device, size_t bytes,
                                  TimelineTag tag) {
  Copy(dst_host, src_device, bytes, cudaMemcpyDeviceToHost, "cudaMemcpyAsync(DeviceToHost)", tag);
}

void CudaStream::CopyDeviceToDevice(void* dst_device, const void* src_device, size_t bytes,
                                    TimelineTag tag) {
  Copy(dst_device, src_device, bytes, cudaMemcpyDeviceToDevice, "cudaMemcpyAsync(DeviceToDevice)",
       tag);
}

void CudaStream::EnqueueHostTask(std::function<void()> fn, TimelineTag tag) {
  EnqueueFallibleHostTask(
      [fn = std::move(fn)]() -> absl::Status {
        fn();
        return absl::OkStatus();
      },
      std::move(tag));
}

void CudaStream::EnqueueFallibleHostTask(std::function<absl::Status()> fn, TimelineTag tag) {
  if (Skipping()) return;
  auto task =
      std::make_unique<HostTask>(HostTask{std::move(fn), std::move(tag), name_, device_, errors_});
  if (lane_ != nullptr) {
    std::shared_ptr<HostTask> shared(std::move(task));
    absl::Status queued = lane_->Enqueue(
        stream_, [shared] { RunHostTask(new HostTask(std::move(*shared))); }, *device_);
    if (!queued.ok()) Fail(std::move(queued));
    return;
  }
  absl::Status launched =
      device_->Check(cudaLaunchHostFunc(stream_, &RunHostTask, task.get()), "cudaLaunchHostFunc");
  if (launched.ok()) {
    task.release();  // the callback owns it now
  } else {
    Fail(std::move(launched));
  }
}

void CudaStream::RecordEvent(Event& event) {
  const CudaEvent& cuda_event = AsCudaEvent(event, name_);
  if (absl::Status recorded =
          device_->Check(cudaEventRecord(cuda_event.native_handle(), stream_), "cudaEventRecord");
      !recorded.ok()) {
    Fail(std::move(recorded));
  }
}

void CudaStream::WaitEvent(const Event& event, TimelineTag tag) {
  const CudaEvent& cuda_event = AsCudaEvent(event, name_);
  // The span runs from the stream reaching the wait to the wait releasing it.
  const std::optional<int> begin = spans_->Begin();
  absl::Status waited = device_->Check(cudaStreamWaitEvent(stream_, cuda_event.native_handle(), 0),
                                       "cudaStreamWaitEvent");
  spans_->End(begin, tag, SpanKind::kWait);
  if (!waited.ok()) Fail(std::move(waited));
}

absl::Status CudaStream::Failure() {
  if (!Skipping()) {
    // A kernel's fault shows only to a call that looks: the query returns the context's sticky
    // error (which marks the device faulted); "not ready" is no failure.
    const cudaError_t queried = cudaStreamQuery(stream_);
    if (queried != cudaSuccess && queried != cudaErrorNotReady) {
      if (absl::Status s = device_->Check(queried, "cudaStreamQuery"); !s.ok()) Fail(std::move(s));
    }
  }
  if (absl::Status fault = device_->fault(); !fault.ok()) return fault;
  std::lock_guard<std::mutex> lock(errors_->mu);
  return errors_->error;
}

absl::Status CudaStream::Synchronize() {
  absl::Status synced = device_->Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  if (synced.ok()) spans_->OnDrained();  // resolves this stream's spans, re-anchors the clock
  if (absl::Status fault = device_->fault(); !fault.ok()) return fault;
  if (!synced.ok()) return synced;
  std::lock_guard<std::mutex> lock(errors_->mu);
  return errors_->error;
}

}  // namespace megatrain::engine
