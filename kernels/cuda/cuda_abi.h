// The C interface between libkiln.so (lib/backend/cuda_loader.cc) and the libkiln_cuda.so module.
// Plain C types only: the two sides are built by different compilers.
#pragma once

#include <stddef.h>
#include <stdint.h>

#define KILN_CUDA_MODULE_ABI 1

extern "C" {

// Returns KILN_CUDA_MODULE_ABI; the loader rejects a module with another value.
typedef int (*kiln_cuda_module_abi_fn)(void);
// Number of usable devices (0 when the driver reports none); writes a message on error (<0).
typedef int (*kiln_cuda_device_count_fn)(char* err, size_t err_cap);
// Name and memory of device `index`. Returns 0 on success.
typedef int (*kiln_cuda_device_info_fn)(int index, char* name, size_t name_cap, size_t* total_mem);
// Dequantizes `n_rows` rows of `n_cols` elements of ggml type `type` from host memory into host
// floats using the device (a round trip used by the op tests). Returns 0 on success.
typedef int (*kiln_cuda_dequantize_fn)(uint32_t type, const void* src, size_t src_bytes,
                                       int64_t n_rows, int64_t n_cols, float* dst);
}
