// CudaStream and CudaEvent: every runtime call checked; host tasks through cudaLaunchHostFunc.
#include "engine/device/cuda_stream.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/device/fatal.h"

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
    std::string name, std::shared_ptr<CudaDeviceState> device) {
  if (absl::Status current = device->MakeCurrent(); !current.ok()) return current;
  cudaStream_t stream = nullptr;
  if (absl::Status created = device->Check(
          cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      !created.ok()) {
    return created;
  }
  device->timeline().RegisterStream(name);
  return std::unique_ptr<CudaStream>(new CudaStream(std::move(name), std::move(device), stream));
}

CudaStream::CudaStream(std::string name, std::shared_ptr<CudaDeviceState> device,
                       cudaStream_t stream)
    : name_(std::move(name)),
      device_(std::move(device)),
      stream_(stream),
      errors_(std::make_shared<CudaStreamErrors>()) {}

CudaStream::~CudaStream() {
  (void)device_->Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  (void)device_->Check(cudaStreamDestroy(stream_), "cudaStreamDestroy");
}

bool CudaStream::Skipping() { return !device_->fault().ok() || errors_->failed(); }

void CudaStream::Fail(absl::Status status) {
  errors_->Set(
      absl::Status(status.code(), absl::StrCat("stream '", name_, "': ", status.message())));
}

void CudaStream::Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                      std::string_view what) {
  if (bytes == 0 || Skipping()) return;
  if (absl::Status copied = device_->Check(cudaMemcpyAsync(dst, src, bytes, kind, stream_), what);
      !copied.ok()) {
    Fail(std::move(copied));
  }
}

void CudaStream::CopyHostToDevice(void* dst_device, const void* src_host, size_t bytes,
                                  TimelineTag /*tag: TODO timing-event spans*/) {
  Copy(dst_device, src_host, bytes, cudaMemcpyHostToDevice, "cudaMemcpyAsync(HostToDevice)");
}

void CudaStream::CopyDeviceToHost(void* dst_host, const void* src_device, size_t bytes,
                                  TimelineTag /*tag: TODO timing-event spans*/) {
  Copy(dst_host, src_device, bytes, cudaMemcpyDeviceToHost, "cudaMemcpyAsync(DeviceToHost)");
}

void CudaStream::CopyDeviceToDevice(void* dst_device, const void* src_device, size_t bytes,
                                    TimelineTag /*tag: TODO timing-event spans*/) {
  Copy(dst_device, src_device, bytes, cudaMemcpyDeviceToDevice, "cudaMemcpyAsync(DeviceToDevice)");
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

void CudaStream::WaitEvent(const Event& event, TimelineTag /*tag: TODO wait spans*/) {
  const CudaEvent& cuda_event = AsCudaEvent(event, name_);
  if (absl::Status waited = device_->Check(
          cudaStreamWaitEvent(stream_, cuda_event.native_handle(), 0), "cudaStreamWaitEvent");
      !waited.ok()) {
    Fail(std::move(waited));
  }
}

absl::Status CudaStream::Synchronize() {
  absl::Status synced = device_->Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  if (absl::Status fault = device_->fault(); !fault.ok()) return fault;
  if (!synced.ok()) return synced;
  std::lock_guard<std::mutex> lock(errors_->mu);
  return errors_->error;
}

}  // namespace megatrain::engine
