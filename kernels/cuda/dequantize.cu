// Device dequantizers for the weight types the CUDA backend reads first (F16, Q8_0, Q4_1).
// Checked against the CPU reference dequantizers by tests/unit/cuda_ops_test.cc on a device.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_abi.h"

#define KILN_CUDA_EXPORT extern "C" __attribute__((visibility("default")))

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
  const int64_t n_total = n_rows * n_cols;
  void* d_src = nullptr;
  float* d_dst = nullptr;
  if (cudaMalloc(&d_src, src_bytes) != cudaSuccess) return -1;
  if (cudaMalloc(&d_dst, n_total * sizeof(float)) != cudaSuccess) {
    cudaFree(d_src);
    return -1;
  }
  int rc = 0;
  cudaMemcpy(d_src, src, src_bytes, cudaMemcpyHostToDevice);
  const int threads = 256;
  const int64_t blocks = (n_total + threads - 1) / threads;
  switch (type) {
    case 1:
      DequantF16<<<blocks, threads>>>(static_cast<const __half*>(d_src), d_dst, n_total);
      break;
    case 8:
      DequantQ8_0<<<blocks, threads>>>(static_cast<const BlockQ8_0*>(d_src), d_dst, n_total);
      break;
    case 3:
      DequantQ4_1<<<blocks, threads>>>(static_cast<const BlockQ4_1*>(d_src), d_dst, n_total);
      break;
    default:
      rc = -2;
  }
  if (rc == 0 && cudaGetLastError() != cudaSuccess) rc = -1;
  if (rc == 0 &&
      cudaMemcpy(dst, d_dst, n_total * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) {
    rc = -1;
  }
  cudaFree(d_src);
  cudaFree(d_dst);
  return rc;
}
