// Device dequantizers for the weight types the CUDA backend reads first (F16, Q8_0, Q4_1).
// Checked against the CPU reference dequantizers by tests/unit/cuda_ops_test.cc on a device.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_abi.h"
#include "kernels/cuda/module_util.h"

namespace {

struct BlockQ8_0 {
  __half d;
  int8_t qs[32];
};
struct BlockQ4_1 {
  __half d;
  __half m;
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ8_0) == 34, "q8_0 block");
static_assert(sizeof(BlockQ4_1) == 20, "q4_1 block");

// One thread per output element; the grid covers n_total elements.
__global__ void DequantF16(const __half* src, float* dst, int64_t n_total) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n_total) dst[i] = __half2float(src[i]);
}

__global__ void DequantQ8_0(const BlockQ8_0* src, float* dst, int64_t n_total) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n_total) return;
  const BlockQ8_0& b = src[i / 32];
  dst[i] = __half2float(b.d) * b.qs[i % 32];
}

__global__ void DequantQ4_1(const BlockQ4_1* src, float* dst, int64_t n_total) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n_total) return;
  const BlockQ4_1& b = src[i / 32];
  const int j = i % 32;
  const int q = j < 16 ? (b.qs[j] & 0xF) : (b.qs[j - 16] >> 4);
  dst[i] = __half2float(b.d) * q + __half2float(b.m);
}

}  // namespace

KILN_CUDA_EXPORT int kiln_cuda_dequantize(uint32_t type, const void* src, size_t src_bytes,
                                          int64_t n_rows, int64_t n_cols, float* dst) {
  using kiln_cuda::Fail;
  if (src == nullptr || dst == nullptr || n_rows < 0 || n_cols < 0) {
    return Fail(KILN_CUDA_INVALID_ARGUMENT, "kiln_cuda_dequantize: null buffer or negative shape");
  }
  const int64_t n_total = n_rows * n_cols;
  if (n_total == 0) return KILN_CUDA_OK;
  // Bytes the type needs for n_total elements; quantized rows are whole 32-element blocks.
  size_t need = 0;
  switch (type) {
    case 1:
      need = size_t(n_total) * 2;
      break;
    case 8:
    case 3:
      if (n_cols % 32 != 0) {
        return Fail(KILN_CUDA_INVALID_ARGUMENT,
                    "kiln_cuda_dequantize: n_cols %lld is not a multiple of 32",
                    static_cast<long long>(n_cols));
      }
      need = size_t(n_total / 32) * (type == 8 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_1));
      break;
    default:
      return Fail(KILN_CUDA_UNSUPPORTED, "kiln_cuda_dequantize: ggml type %u has no kernel", type);
  }
  if (src_bytes < need) {
    return Fail(KILN_CUDA_INVALID_ARGUMENT, "kiln_cuda_dequantize: src has %zu bytes, needs %zu",
                src_bytes, need);
  }
  void* d_src = nullptr;
  float* d_dst = nullptr;
  int rc = kiln_cuda::Check(cudaMalloc(&d_src, need), "kiln_cuda_dequantize: cudaMalloc");
  if (rc == KILN_CUDA_OK) {
    rc = kiln_cuda::Check(cudaMalloc(&d_dst, size_t(n_total) * sizeof(float)),
                          "kiln_cuda_dequantize: cudaMalloc");
  }
  if (rc == KILN_CUDA_OK) {
    rc = kiln_cuda::Check(cudaMemcpy(d_src, src, need, cudaMemcpyHostToDevice),
                          "kiln_cuda_dequantize: upload");
  }
  if (rc == KILN_CUDA_OK) {
    const int threads = 256;
    const int64_t blocks = (n_total + threads - 1) / threads;
    if (type == 1) {
      DequantF16<<<blocks, threads>>>(static_cast<const __half*>(d_src), d_dst, n_total);
    } else if (type == 8) {
      DequantQ8_0<<<blocks, threads>>>(static_cast<const BlockQ8_0*>(d_src), d_dst, n_total);
    } else {
      DequantQ4_1<<<blocks, threads>>>(static_cast<const BlockQ4_1*>(d_src), d_dst, n_total);
    }
    rc = kiln_cuda::Check(cudaGetLastError(), "kiln_cuda_dequantize: launch");
  }
  if (rc == KILN_CUDA_OK) {
    rc = kiln_cuda::Check(
        cudaMemcpy(dst, d_dst, size_t(n_total) * sizeof(float), cudaMemcpyDeviceToHost),
        "kiln_cuda_dequantize: download");
  }
  cudaFree(d_src);
  cudaFree(d_dst);
  return rc;
}
