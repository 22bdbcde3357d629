// Prefill and wide-verification GEMMs on cuBLASLt: the weight is dequantized to f16 once (the
// caller keeps the copy), the activations are converted to f16 per call, and cublasLtMatmul
// multiplies them with f32 accumulation into f32 outputs, with the algorithm the library's
// heuristics choose for the shape and the context's workspace.
#include <cublasLt.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <new>

#include "kernels/cuda/cuda_abi.h"
#include "kernels/cuda/module_util.h"
#include "kernels/cuda/quant_decode.cuh"

struct KilnCudaGemmContext {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  __half* x_f16 = nullptr;  // the activations in f16, x_f16_elems elements
  size_t x_f16_elems = 0;
};

namespace kiln::cuda {
namespace {

// One thread per element of W: d_out[r * n_cols + c] = element c of row r. grid covers n_total.
template <uint32_t kType>
__global__ void DequantizeToF16Kernel(const uint8_t* __restrict__ w, int64_t n_cols,
                                      int64_t n_total, __half* __restrict__ out) {
  using B = Block<kType>;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_total) return;
  const int64_t r = i / n_cols, c = i % n_cols;
  const uint8_t* block = w + (r * (n_cols / B::kElems) + c / B::kElems) * B::kBytes;
  out[i] = __float2half_rn(B::Decode(block, static_cast<int>(c % B::kElems)));
}

__global__ void F32ToF16Kernel(const float* __restrict__ x, int64_t n, __half* __restrict__ y) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __float2half_rn(x[i]);
}

constexpr int kThreads = 256;

int GridFor(int64_t n, unsigned* grid) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > 0x7fffffff) {
    return kiln_cuda::Fail(KILN_CUDA_INVALID_ARGUMENT, "kiln_cuda_gemm: %lld elements too many",
                           static_cast<long long>(n));
  }
  *grid = static_cast<unsigned>(blocks);
  return 0;
}

template <uint32_t kType>
int LaunchDequantize(const void* w, int64_t n_rows, int64_t n_cols, __half* out,
                     cudaStream_t stream) {
  if (n_cols % Block<kType>::kElems != 0) {
    return kiln_cuda::Fail(KILN_CUDA_INVALID_ARGUMENT,
                           "kiln_cuda_dequantize_f16: n_cols %lld is not a multiple of the type's "
                           "block (%d)",
                           static_cast<long long>(n_cols), Block<kType>::kElems);
  }
  unsigned grid = 0;
  if (const int rc = GridFor(n_rows * n_cols, &grid); rc != KILN_CUDA_OK) return rc;
  DequantizeToF16Kernel<kType>
      <<<grid, kThreads, 0, stream>>>(static_cast<const uint8_t*>(w), n_cols, n_rows * n_cols, out);
  return kiln_cuda::Check(cudaGetLastError(), "kiln_cuda_dequantize_f16: launch");
}

// Matrix layouts and descriptor, destroyed together.
struct LtObjects {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtObjects() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace
}  // namespace kiln::cuda

KILN_CUDA_EXPORT int kiln_cuda_dequantize_f16(uint32_t type, const void* d_w, int64_t n_rows,
                                              int64_t n_cols, void* d_out_f16,
                                              kiln_cuda_stream stream) {
  using namespace kiln::cuda;
  if (d_w == nullptr || d_out_f16 == nullptr || n_rows <= 0 || n_cols <= 0) {
    return kiln_cuda::Fail(KILN_CUDA_INVALID_ARGUMENT,
                           "kiln_cuda_dequantize_f16: null pointer or empty shape (%lld x %lld)",
                           static_cast<long long>(n_rows), static_cast<long long>(n_cols));
  }
  if (const int rc = kiln_cuda::Enter(stream, "kiln_cuda_dequantize_f16"); rc != KILN_CUDA_OK) {
    return rc;
  }
  auto* out = static_cast<__half*>(d_out_f16);
  cudaStream_t s = stream->stream;
  switch (type) {
    case kTypeF16:
      return LaunchDequantize<kTypeF16>(d_w, n_rows, n_cols, out, s);
    case kTypeQ4_1:
      return LaunchDequantize<kTypeQ4_1>(d_w, n_rows, n_cols, out, s);
    case kTypeQ5_0:
      return LaunchDequantize<kTypeQ5_0>(d_w, n_rows, n_cols, out, s);
    case kTypeQ8_0:
      return LaunchDequantize<kTypeQ8_0>(d_w, n_rows, n_cols, out, s);
    case kTypeQ4_K:
      return LaunchDequantize<kTypeQ4_K>(d_w, n_rows, n_cols, out, s);
    case kTypeQ6_K:
      return LaunchDequantize<kTypeQ6_K>(d_w, n_rows, n_cols, out, s);
    default:
      return kiln_cuda::Fail(KILN_CUDA_UNSUPPORTED,
                             "kiln_cuda_dequantize_f16: no kernel for ggml type %u", type);
  }
}

KILN_CUDA_EXPORT int kiln_cuda_gemm_context_create(int device, size_t workspace_bytes,
                                                   KilnCudaGemmContext** out) {
  if (out == nullptr) {
    return kiln_cuda::Fail(KILN_CUDA_INVALID_ARGUMENT, "kiln_cuda_gemm_context_create: null out");
  }
  *out = nullptr;
  KILN_CUDA_CHECK(cudaSetDevice(device));
  auto* ctx = new (std::nothrow) KilnCudaGemmContext;
  if (ctx == nullptr) {
    return kiln_cuda::Fail(KILN_CUDA_OUT_OF_MEMORY, "kiln_cuda_gemm_context_create: host memory");
  }
  if (const cublasStatus_t st = cublasLtCreate(&ctx->handle); st != CUBLAS_STATUS_SUCCESS) {
    delete ctx;
    return kiln_cuda::Fail(KILN_CUDA_DEVICE_ERROR,
                           "kiln_cuda_gemm_context_create: cublasLtCreate: %s",
                           cublasLtGetStatusString(st));
  }
  if (workspace_bytes > 0) {
    if (const int rc = kiln_cuda::Check(cudaMalloc(&ctx->workspace, workspace_bytes),
                                        "kiln_cuda_gemm_context_create: cudaMalloc(workspace)");
        rc != KILN_CUDA_OK) {
      cublasLtDestroy(ctx->handle);
      delete ctx;
      return rc;
    }
  }
  ctx->workspace_bytes = workspace_bytes;
  *out = ctx;
  return KILN_CUDA_OK;
}

KILN_CUDA_EXPORT void kiln_cuda_gemm_context_destroy(KilnCudaGemmContext* ctx) {
  if (ctx == nullptr) return;
  cudaFree(ctx->x_f16);
  cudaFree(ctx->workspace);
  cublasLtDestroy(ctx->handle);
  delete ctx;
}

// Row-major y[n_tokens, n_out] = x[n_tokens, n_in] . W[n_out, n_in]^T is, column-major,
// D (n_out x n_tokens) = op(A) . B with A = W as (n_in x n_out, lda n_in) transposed and
// B = x as (n_in x n_tokens, ldb n_in).
KILN_CUDA_EXPORT int kiln_cuda_gemm_f16(KilnCudaGemmContext* ctx, const void* d_w_f16,
                                        int64_t n_out, int64_t n_in, const float* d_x,
                                        int64_t n_tokens, float* d_y, kiln_cuda_stream stream) {
  using namespace kiln::cuda;
  if (ctx == nullptr || d_w_f16 == nullptr || d_x == nullptr || d_y == nullptr || n_out <= 0 ||
      n_in <= 0 || n_tokens <= 0 || n_out % 8 != 0 || n_in % 8 != 0) {
    return kiln_cuda::Fail(KILN_CUDA_INVALID_ARGUMENT,
                           "kiln_cuda_gemm_f16: null pointer or shape out of range (n_out %lld and "
                           "n_in %lld multiples of 8, n_tokens %lld >= 1)",
                           static_cast<long long>(n_out), static_cast<long long>(n_in),
                           static_cast<long long>(n_tokens));
  }
  if (const int rc = kiln_cuda::Enter(stream, "kiln_cuda_gemm_f16"); rc != KILN_CUDA_OK) return rc;
  cudaStream_t s = stream->stream;
  const int64_t x_elems = n_tokens * n_in;
  if (static_cast<size_t>(x_elems) > ctx->x_f16_elems) {
    // The old buffer may still be read by work queued on the stream.
    KILN_CUDA_CHECK(cudaStreamSynchronize(s));
    cudaFree(ctx->x_f16);
    ctx->x_f16 = nullptr;
    ctx->x_f16_elems = 0;
    KILN_CUDA_CHECK(cudaMalloc(&ctx->x_f16, x_elems * sizeof(__half)));
    ctx->x_f16_elems = static_cast<size_t>(x_elems);
  }
  unsigned grid = 0;
  if (const int rc = GridFor(x_elems, &grid); rc != KILN_CUDA_OK) return rc;
  F32ToF16Kernel<<<grid, kThreads, 0, s>>>(d_x, x_elems, ctx->x_f16);
  KILN_CUDA_CHECK(cudaGetLastError());

  LtObjects lt;
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  const float alpha = 1.0f, beta = 0.0f;
  if (cublasLtMatmulDescCreate(&lt.op, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a,
                                     sizeof trans_a) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b,
                                     sizeof trans_b) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatrixLayoutCreate(&lt.a, CUDA_R_16F, n_in, n_out, n_in) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatrixLayoutCreate(&lt.b, CUDA_R_16F, n_in, n_tokens, n_in) !=
          CUBLAS_STATUS_SUCCESS ||
      cublasLtMatrixLayoutCreate(&lt.d, CUDA_R_32F, n_out, n_tokens, n_out) !=
          CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulPreferenceCreate(&lt.pref) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulPreferenceSetAttribute(lt.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &ctx->workspace_bytes,
                                           sizeof ctx->workspace_bytes) != CUBLAS_STATUS_SUCCESS) {
    return kiln_cuda::Fail(KILN_CUDA_DEVICE_ERROR,
                           "kiln_cuda_gemm_f16: creating the cuBLASLt descriptors failed");
  }
  cublasLtMatmulHeuristicResult_t heuristic = {};
  int found = 0;
  if (cublasLtMatmulAlgoGetHeuristic(ctx->handle, lt.op, lt.a, lt.b, lt.d, lt.d, lt.pref, 1,
                                     &heuristic, &found) != CUBLAS_STATUS_SUCCESS ||
      found == 0) {
    return kiln_cuda::Fail(KILN_CUDA_UNSUPPORTED,
                           "kiln_cuda_gemm_f16: cuBLASLt has no algorithm for %lld x %lld x %lld",
                           static_cast<long long>(n_out), static_cast<long long>(n_in),
                           static_cast<long long>(n_tokens));
  }
  const cublasStatus_t st =
      cublasLtMatmul(ctx->handle, lt.op, &alpha, d_w_f16, lt.a, ctx->x_f16, lt.b, &beta, d_y, lt.d,
                     d_y, lt.d, &heuristic.algo, ctx->workspace, ctx->workspace_bytes, s);
  if (st != CUBLAS_STATUS_SUCCESS) {
    return kiln_cuda::Fail(KILN_CUDA_DEVICE_ERROR, "kiln_cuda_gemm_f16: cublasLtMatmul: %s",
                           cublasLtGetStatusString(st));
  }
  return KILN_CUDA_OK;
}
