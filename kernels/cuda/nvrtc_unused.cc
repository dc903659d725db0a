// Link-time stand-ins for the seven NVRTC functions cudnn-frontend 1.32
// references from an experimental Blackwell RMSNorm+SiLU engine
// (cudnn_frontend/experimental/sm100_rms_norm_silu_engine.h, compiled in by
// plans.h) that our attention graphs never construct. Linking libnvrtc
// (109 MB) for code that never runs would make every binary holding
// CudaLayerMath need it at start-up; these weak, hidden definitions bind only
// inside the library that holds cudnn_attention and interpose on nobody
// (cuDNN's own runtime-compiled engines dlopen libnvrtc themselves).
// Should that engine ever run, it gets NVRTC_ERROR_INTERNAL_ERROR and
// cudnn-frontend reports the failure as a status.
#include <nvrtc.h>

#include <cstddef>

#define MT_NVRTC_UNUSED extern "C" __attribute__((weak, visibility("hidden")))

MT_NVRTC_UNUSED nvrtcResult nvrtcCreateProgram(nvrtcProgram*, const char*, const char*, int,
                                               const char* const*, const char* const*) {
  return NVRTC_ERROR_INTERNAL_ERROR;
}
MT_NVRTC_UNUSED nvrtcResult nvrtcDestroyProgram(nvrtcProgram*) {
  return NVRTC_ERROR_INTERNAL_ERROR;
}
MT_NVRTC_UNUSED nvrtcResult nvrtcCompileProgram(nvrtcProgram, int, const char* const*) {
  return NVRTC_ERROR_INTERNAL_ERROR;
}
MT_NVRTC_UNUSED nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram, size_t*) {
  return NVRTC_ERROR_INTERNAL_ERROR;
}
MT_NVRTC_UNUSED nvrtcResult nvrtcGetProgramLog(nvrtcProgram, char*) {
  return NVRTC_ERROR_INTERNAL_ERROR;
}
MT_NVRTC_UNUSED nvrtcResult nvrtcGetCUBINSize(nvrtcProgram, size_t*) {
  return NVRTC_ERROR_INTERNAL_ERROR;
}
MT_NVRTC_UNUSED nvrtcResult nvrtcGetCUBIN(nvrtcProgram, char*) {
  return NVRTC_ERROR_INTERNAL_ERROR;
}
