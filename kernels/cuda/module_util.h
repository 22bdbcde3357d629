// What every .cu file of the module shares: the export macro, the stream handle behind
// kiln_cuda_stream, and the per-thread error message with the helpers that turn a CUDA runtime
// error into a KILN_CUDA_* status (kernels/cuda/cuda_abi.h).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cuda/cuda_abi.h"

#define KILN_CUDA_EXPORT extern "C" __attribute__((visibility("default")))

// The object a kiln_cuda_stream points to.
struct kiln_cuda_stream_s {
  cudaStream_t stream = nullptr;
  int device = 0;
};

namespace kiln_cuda {

// Records the calling thread's error message (printf format) and returns `status`.
int Fail(int status, const char* format, ...) __attribute__((format(printf, 2, 3)));

// KILN_CUDA_OK for cudaSuccess; otherwise records "<what>: <cuda error name>: <description>",
// clears the runtime's non-sticky error state, and returns KILN_CUDA_OUT_OF_MEMORY or
// KILN_CUDA_DEVICE_ERROR.
int Check(cudaError_t e, const char* what);

// Check with the message "<function>: <call>: ...".
int CheckIn(const char* function, cudaError_t e, const char* call);

// Makes the stream's device current on this thread; INVALID_ARGUMENT for a null stream.
int Enter(kiln_cuda_stream stream, const char* what);

}  // namespace kiln_cuda

// Returns from the enclosing function with the status of a failed CUDA call; the message names
// the exported function and the call ("kiln_cuda_device_alloc: cudaSetDevice(device): ...").
#define KILN_CUDA_CHECK(call)                                                \
  do {                                                                       \
    const int kiln_cuda_rc_ = ::kiln_cuda::CheckIn(__func__, (call), #call); \
    if (kiln_cuda_rc_ != KILN_CUDA_OK) return kiln_cuda_rc_;                 \
  } while (0)
