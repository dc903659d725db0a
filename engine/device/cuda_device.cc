// CudaDevice: discovery, arena reservation, pinned memory and the Device methods.
#include "engine/device/cuda_device.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/device/cuda_stream.h"

namespace megatrain::engine {

CudaPinnedPool::CudaPinnedPool(size_t budget_bytes, std::shared_ptr<CudaDeviceState> device)
    : PinnedMemoryPool(budget_bytes), device_(std::move(device)) {}

CudaPinnedPool::~CudaPinnedPool() { CheckNoLiveBuffers(); }

absl::StatusOr<void*> CudaPinnedPool::AllocateRaw(size_t bytes) {
  void* data = nullptr;
  if (absl::Status allocated =
          device_->Check(cudaHostAlloc(&data, bytes, cudaHostAllocPortable),
                         absl::StrCat("cudaHostAlloc of ", bytes, " pinned bytes"));
      !allocated.ok()) {
    return allocated;
  }
  return data;
}

void CudaPinnedPool::FreeRaw(void* data, size_t /*bytes*/) {
  (void)device_->Check(cudaFreeHost(data), "cudaFreeHost");
}

namespace {

// Initializes the device with cudaDeviceScheduleBlockingSync, then reads the flags back. Any
// failure is a reason to run with the driver's default, never an error of the device; the
// runtime's last error is cleared so no later launch check reports it.
absl::Status SetBlockingSync(int ordinal, bool wanted) {
  if (!wanted) return absl::FailedPreconditionError("cuda_blocking_sync is off");
  if (const cudaError_t e =
          cudaInitDevice(ordinal, cudaDeviceScheduleBlockingSync, cudaInitDeviceFlagsAreValid);
      e != cudaSuccess) {
    (void)cudaGetLastError();
    return CudaErrorToStatus(e, "cudaInitDevice(cudaDeviceScheduleBlockingSync)");
  }
  int previous = 0;
  unsigned int flags = 0;
  if (cudaGetDevice(&previous) != cudaSuccess || cudaSetDevice(ordinal) != cudaSuccess ||
      cudaGetDeviceFlags(&flags) != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::UnknownError("could not read the device flags back");
  }
  (void)cudaSetDevice(previous);
  if ((flags & cudaDeviceScheduleMask) != cudaDeviceScheduleBlockingSync) {
    return absl::FailedPreconditionError(
        absl::StrCat("the primary context keeps schedule flags ", flags & cudaDeviceScheduleMask));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> CountCudaDevices() {
  int count = 0;
  if (const cudaError_t error = cudaGetDeviceCount(&count); error != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device: ", cudaGetErrorString(error)));
  }
  if (count == 0) {
    return absl::FailedPreconditionError("no CUDA device: cudaGetDeviceCount found 0 devices");
  }
  return count;
}

absl::StatusOr<std::string> CudaDeviceUuid(int ordinal) {
  cudaDeviceProp properties{};
  if (const cudaError_t error = cudaGetDeviceProperties(&properties, ordinal);
      error != cudaSuccess) {
    return CudaErrorToStatus(error, absl::StrCat("cudaGetDeviceProperties(", ordinal, ")"));
  }
  std::string uuid = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) uuid += '-';
    absl::StrAppend(&uuid, absl::Hex(static_cast<unsigned char>(properties.uuid.bytes[i]),
                                     absl::kZeroPad2));
  }
  return uuid;
}

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create(const DeviceOptions& options) {
  if (options.kind != DeviceKind::kCuda) {
    return absl::InvalidArgumentError(absl::StrCat("CudaDevice::Create: kind must be cuda, got ",
                                                   std::string(DeviceKindName(options.kind))));
  }
  if (absl::Status valid = ValidateDeviceOptions(options); !valid.ok()) return valid;

  absl::StatusOr<int> counted = CountCudaDevices();
  if (!counted.ok()) return counted.status();
  const int count = *counted;
  if (options.cuda_device_ordinal >= count) {
    return absl::InvalidArgumentError(absl::StrCat("cuda_device_ordinal must be < ", count,
                                                   " (devices found), got ",
                                                   options.cuda_device_ordinal));
  }
  const int ordinal = options.cuda_device_ordinal;
  cudaDeviceProp properties{};
  if (const cudaError_t error = cudaGetDeviceProperties(&properties, ordinal);
      error != cudaSuccess) {
    return CudaErrorToStatus(error, absl::StrCat("cudaGetDeviceProperties(", ordinal, ")"));
  }
  auto state = std::make_shared<CudaDeviceState>(
      ordinal, absl::StrCat("cuda:", ordinal, " (", properties.name, ")"));
  // Before cudaSetDevice, which creates the primary context with the flags it then has.
  absl::Status blocking_sync = SetBlockingSync(ordinal, options.cuda_blocking_sync);
  if (absl::Status current = state->MakeCurrent(); !current.ok()) return current;

  void* arena_memory = nullptr;
  if (const cudaError_t error = cudaMalloc(&arena_memory, options.arena_bytes);
      error != cudaSuccess) {
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    (void)cudaMemGetInfo(&free_bytes, &total_bytes);
    absl::Status status = state->Check(error, "cudaMalloc of the arena");
    return absl::Status(status.code(),
                        absl::StrCat(status.message(), "; arena_bytes=", options.arena_bytes,
                                     ", device free ", free_bytes, " of ", total_bytes, " bytes"));
  }
  state->timeline().set_enabled(options.record_timeline);
  std::unique_ptr<CudaDevice> device(new CudaDevice(options, std::move(state), arena_memory));
  device->blocking_sync_status_ = std::move(blocking_sync);
  return device;
}

CudaDevice::CudaDevice(const DeviceOptions& options, std::shared_ptr<CudaDeviceState> state,
                       void* arena_memory)
    : state_(std::move(state)),
      arena_memory_(arena_memory),
      arena_(std::make_unique<DeviceArena>(arena_memory, options.arena_bytes, state_->name())),
      pinned_(options.pinned_budget_bytes, state_),
      host_task_threads_(options.cuda_host_task_threads) {}

CudaDevice::~CudaDevice() {
  arena_.reset();  // checks for live buffers before the memory goes
  (void)state_->MakeCurrent();
  (void)state_->Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  (void)state_->Check(cudaFree(arena_memory_), "cudaFree of the arena");
}

absl::StatusOr<std::unique_ptr<Stream>> CudaDevice::CreateStream(std::string name) {
  if (name.empty()) return absl::InvalidArgumentError("stream name must be non-empty, got \"\"");
  absl::StatusOr<std::unique_ptr<CudaStream>> stream = CudaStream::Create(std::move(name), state_, host_task_threads_);
  if (!stream.ok()) return stream.status();
  return std::unique_ptr<Stream>(std::move(*stream));
}

absl::StatusOr<std::unique_ptr<Event>> CudaDevice::CreateEvent() {
  absl::StatusOr<std::unique_ptr<CudaEvent>> event = CudaEvent::Create(state_);
  if (!event.ok()) return event.status();
  return std::unique_ptr<Event>(std::move(*event));
}

absl::StatusOr<DeviceBuffer> CudaDevice::Allocate(size_t bytes, std::string_view tag) {
  return arena_->Allocate(bytes, tag);
}

absl::StatusOr<PinnedHostBuffer> CudaDevice::AllocatePinned(size_t bytes) {
  return pinned_.Allocate(bytes);
}

absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(const DeviceOptions& options) {
  absl::StatusOr<std::unique_ptr<CudaDevice>> device = CudaDevice::Create(options);
  if (!device.ok()) return device.status();
  return std::unique_ptr<Device>(std::move(*device));
}

}  // namespace megatrain::engine
