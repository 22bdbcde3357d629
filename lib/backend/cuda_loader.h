// Finds and opens the optional CUDA backend module (libkiln_cuda.so) at run time. Without the
// module, a CUDA driver or a device, kiln runs on the CPU; the reason is kept for `kiln info`.
#pragma once

#include <string>

#include "kernels/cuda/cuda_abi.h"

namespace kiln {

struct CudaModule {
  kiln_cuda_device_count_fn device_count = nullptr;
  kiln_cuda_device_info_fn device_info = nullptr;
  kiln_cuda_dequantize_fn dequantize = nullptr;
  int n_devices = 0;
};

// The module when at least one device is usable, else nullptr with `*why_not` set. Searched in
// order: $KILN_CUDA_MODULE, beside the binary holding kiln's code, the build tree. Thread-safe;
// the work happens once per process.
const CudaModule* GetCudaModule(std::string* why_not);

}  // namespace kiln
