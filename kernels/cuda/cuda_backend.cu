#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

#include "kernels/cuda/cuda_abi.h"
#include "kernels/cuda/module_util.h"

KILN_CUDA_EXPORT int kiln_cuda_module_abi(void) { return KILN_CUDA_MODULE_ABI; }

KILN_CUDA_EXPORT int kiln_cuda_device_count(char* err, size_t err_cap) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  // No device, or no (or too old a) driver: zero devices, with the runtime's reason for the log.
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
    if (err && err_cap) std::snprintf(err, err_cap, "%s", cudaGetErrorString(e));
    return 0;
  }
  if (e != cudaSuccess) {
    if (err && err_cap)
      std::snprintf(err, err_cap, "cudaGetDeviceCount: %s", cudaGetErrorString(e));
    return -1;
  }
  return count;
}

KILN_CUDA_EXPORT int kiln_cuda_device_info(int index, char* name, size_t name_cap,
                                           size_t* total_mem) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) return -1;
  if (name && name_cap) std::snprintf(name, name_cap, "%s", prop.name);
  if (total_mem) *total_mem = prop.totalGlobalMem;
  return 0;
}
