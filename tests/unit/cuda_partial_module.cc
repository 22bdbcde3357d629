// A stand-in for libkiln_cuda.so with the current ABI number but only two of its entry points:
// cuda_ops_test checks that the loader rejects it and names every missing entry.
#include "kernels/cuda/cuda_abi.h"

extern "C" __attribute__((visibility("default"))) int kiln_cuda_module_abi(void) {
  return KILN_CUDA_MODULE_ABI;
}

extern "C" __attribute__((visibility("default"))) int kiln_cuda_device_count(char*, size_t) {
  return 0;
}
