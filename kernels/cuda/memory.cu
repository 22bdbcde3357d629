// The "memory and streams" section of cuda_abi.h, and the per-thread error message.
#include <cuda_runtime.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <new>

#include "kernels/cuda/cuda_abi.h"
#include "kernels/cuda/module_util.h"

namespace kiln_cuda {
namespace {

// Per thread: engines on different threads each read back their own failure.
thread_local char g_last_error[512] = {0};

}  // namespace

int Fail(int status, const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::vsnprintf(g_last_error, sizeof g_last_error, format, args);
  va_end(args);
  return status;
}

int Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return KILN_CUDA_OK;
  // Clears a non-sticky error so that the next launch check does not report it again.
  (void)cudaGetLastError();
  const int status =
      e == cudaErrorMemoryAllocation ? KILN_CUDA_OUT_OF_MEMORY : KILN_CUDA_DEVICE_ERROR;
  return Fail(status, "%s: %s: %s", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

int CheckIn(const char* function, cudaError_t e, const char* call) {
  if (e == cudaSuccess) return KILN_CUDA_OK;
  char what[160];
  std::snprintf(what, sizeof what, "%s: %s", function, call);
  return Check(e, what);
}

int Enter(kiln_cuda_stream stream, const char* what) {
  if (stream == nullptr) return Fail(KILN_CUDA_INVALID_ARGUMENT, "%s: null stream", what);
  return Check(cudaSetDevice(stream->device), what);
}

}  // namespace kiln_cuda

using kiln_cuda::Check;
using kiln_cuda::Enter;
using kiln_cuda::Fail;

KILN_CUDA_EXPORT size_t kiln_cuda_last_error(char* msg, size_t msg_cap) {
  const size_t len = std::strlen(kiln_cuda::g_last_error);
  if (msg != nullptr && msg_cap > 0) std::snprintf(msg, msg_cap, "%s", kiln_cuda::g_last_error);
  return len;
}

KILN_CUDA_EXPORT int kiln_cuda_mem_info(int device, size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) {
    return Fail(KILN_CUDA_INVALID_ARGUMENT, "kiln_cuda_mem_info: null output");
  }
  KILN_CUDA_CHECK(cudaSetDevice(device));
  KILN_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
  return KILN_CUDA_OK;
}

KILN_CUDA_EXPORT int kiln_cuda_stream_create(int device, kiln_cuda_stream* out) {
  if (out == nullptr) return Fail(KILN_CUDA_INVALID_ARGUMENT, "kiln_cuda_stream_create: null out");
  *out = nullptr;
  KILN_CUDA_CHECK(cudaSetDevice(device));
  auto* s = new (std::nothrow) kiln_cuda_stream_s;
  if (s == nullptr) return Fail(KILN_CUDA_OUT_OF_MEMORY, "kiln_cuda_stream_create: host memory");
  s->device = device;
  const int rc = Check(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking),
                       "kiln_cuda_stream_create: cudaStreamCreateWithFlags");
  if (rc != KILN_CUDA_OK) {
    delete s;
    return rc;
  }
  *out = s;
  return KILN_CUDA_OK;
}

KILN_CUDA_EXPORT int kiln_cuda_stream_destroy(kiln_cuda_stream stream) {
  if (stream == nullptr) return KILN_CUDA_OK;
  int rc = Enter(stream, "kiln_cuda_stream_destroy");
  if (rc == KILN_CUDA_OK) {
    rc = Check(cudaStreamSynchronize(stream->stream), "kiln_cuda_stream_destroy: synchronize");
  }
  // Destroyed even when the queued work failed: the handle is gone for the caller either way.
  const int rc_destroy =
      Check(cudaStreamDestroy(stream->stream), "kiln_cuda_stream_destroy: cudaStreamDestroy");
  delete stream;
  return rc != KILN_CUDA_OK ? rc : rc_destroy;
}

KILN_CUDA_EXPORT int kiln_cuda_stream_synchronize(kiln_cuda_stream stream) {
  if (const int rc = Enter(stream, "kiln_cuda_stream_synchronize"); rc != KILN_CUDA_OK) return rc;
  return Check(cudaStreamSynchronize(stream->stream), "kiln_cuda_stream_synchronize");
}

KILN_CUDA_EXPORT int kiln_cuda_device_alloc(int device, size_t bytes, void** out) {
  if (out == nullptr) return Fail(KILN_CUDA_INVALID_ARGUMENT, "kiln_cuda_device_alloc: null out");
  *out = nullptr;
  if (bytes == 0) return KILN_CUDA_OK;
  KILN_CUDA_CHECK(cudaSetDevice(device));
  const cudaError_t e = cudaMalloc(out, bytes);
  if (e != cudaSuccess) {
    *out = nullptr;
    (void)cudaGetLastError();
    return Fail(e == cudaErrorMemoryAllocation ? KILN_CUDA_OUT_OF_MEMORY : KILN_CUDA_DEVICE_ERROR,
                "kiln_cuda_device_alloc: %zu bytes on device %d: %s", bytes, device,
                cudaGetErrorString(e));
  }
  return KILN_CUDA_OK;
}

KILN_CUDA_EXPORT int kiln_cuda_device_free(void* ptr) {
  if (ptr == nullptr) return KILN_CUDA_OK;
  return Check(cudaFree(ptr), "kiln_cuda_device_free");
}

KILN_CUDA_EXPORT int kiln_cuda_host_alloc(size_t bytes, void** out) {
  if (out == nullptr) return Fail(KILN_CUDA_INVALID_ARGUMENT, "kiln_cuda_host_alloc: null out");
  *out = nullptr;
  if (bytes == 0) return KILN_CUDA_OK;
  const cudaError_t e = cudaMallocHost(out, bytes);
  if (e != cudaSuccess) {
    *out = nullptr;
    (void)cudaGetLastError();
    return Fail(e == cudaErrorMemoryAllocation ? KILN_CUDA_OUT_OF_MEMORY : KILN_CUDA_DEVICE_ERROR,
                "kiln_cuda_host_alloc: %zu bytes: %s", bytes, cudaGetErrorString(e));
  }
  return KILN_CUDA_OK;
}

KILN_CUDA_EXPORT int kiln_cuda_host_free(void* ptr) {
  if (ptr == nullptr) return KILN_CUDA_OK;
  return Check(cudaFreeHost(ptr), "kiln_cuda_host_free");
}

namespace {

int CopyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
              kiln_cuda_stream stream, const char* what) {
  if (bytes == 0) return KILN_CUDA_OK;
  if (dst == nullptr || src == nullptr) {
    return Fail(KILN_CUDA_INVALID_ARGUMENT, "%s: null %s (%zu bytes)", what,
                dst == nullptr ? "destination" : "source", bytes);
  }
  if (const int rc = Enter(stream, what); rc != KILN_CUDA_OK) return rc;
  return Check(cudaMemcpyAsync(dst, src, bytes, kind, stream->stream), what);
}

}  // namespace

KILN_CUDA_EXPORT int kiln_cuda_copy_h2d_async(void* dst_device, const void* src_host, size_t bytes,
                                              kiln_cuda_stream stream) {
  return CopyAsync(dst_device, src_host, bytes, cudaMemcpyHostToDevice, stream,
                   "kiln_cuda_copy_h2d_async");
}

KILN_CUDA_EXPORT int kiln_cuda_copy_d2h_async(void* dst_host, const void* src_device, size_t bytes,
                                              kiln_cuda_stream stream) {
  return CopyAsync(dst_host, src_device, bytes, cudaMemcpyDeviceToHost, stream,
                   "kiln_cuda_copy_d2h_async");
}

KILN_CUDA_EXPORT int kiln_cuda_copy_d2d_async(void* dst_device, const void* src_device,
                                              size_t bytes, kiln_cuda_stream stream) {
  return CopyAsync(dst_device, src_device, bytes, cudaMemcpyDeviceToDevice, stream,
                   "kiln_cuda_copy_d2d_async");
}

KILN_CUDA_EXPORT int kiln_cuda_memset_async(void* dst_device, int value, size_t bytes,
                                            kiln_cuda_stream stream) {
  if (bytes == 0) return KILN_CUDA_OK;
  if (dst_device == nullptr) {
    return Fail(KILN_CUDA_INVALID_ARGUMENT, "kiln_cuda_memset_async: null destination");
  }
  if (const int rc = Enter(stream, "kiln_cuda_memset_async"); rc != KILN_CUDA_OK) return rc;
  return Check(cudaMemsetAsync(dst_device, value, bytes, stream->stream), "kiln_cuda_memset_async");
}
