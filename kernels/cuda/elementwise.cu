// The element-wise and row ops of the "elementwise ops" section of cuda_abi.h: RMSNorm, Add,
// AddRowBias, SwiGLU, GeGLU, Scale, RoPE rotation and the embedding gather. Each is checked
// against the CPU backend by tests/unit/cuda_backend_test.cc on a device.
//
// Launch shapes: the 1-D ops use a grid-stride loop over int64 indices with at most kMaxBlocks
// blocks of kThreads threads, so any n (including n beyond 2^31) is covered and no grid exceeds
// the device limits. RMSNorm uses one block per row. n == 0 launches nothing.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "kernels/cuda/cuda_abi.h"
#include "kernels/cuda/module_util.h"

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

unsigned BlocksFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

#define KILN_GRID_STRIDE(i, n)                                              \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

__global__ void AddKernel(const float* a, const float* b, int64_t n, float* y) {
  KILN_GRID_STRIDE(i, n) { y[i] = __fadd_rn(a[i], b[i]); }
}

__global__ void AddRowBiasKernel(float* x, const float* bias, int64_t total, int64_t n) {
  KILN_GRID_STRIDE(i, total) { x[i] = __fadd_rn(x[i], bias[i % n]); }
}

__global__ void ScaleKernel(float* x, int64_t n, float s) {
  KILN_GRID_STRIDE(i, n) { x[i] = __fmul_rn(x[i], s); }
}

// silu(g) * up = g / (1 + e^-g) * up, in float (expf, not the fast __expf).
__global__ void SwiGluKernel(const float* gate, const float* up, int64_t n, float* y) {
  KILN_GRID_STRIDE(i, n) {
    const float g = gate[i];
    y[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), up[i]);
  }
}

// ggml's GeGLU (cpu::GeGlu): g <= -10: 0; g >= 10: g * up; otherwise the f16 GELU table at the
// f16 bits of g (round to nearest even), widened, times up. The table is the CPU's, uploaded.
__global__ void GeGluKernel(const float* gate, const float* up, int64_t n, const uint16_t* table,
                            float* y) {
  KILN_GRID_STRIDE(i, n) {
    const float g = gate[i];
    float gelu;
    if (g <= -10.0f) {
      y[i] = 0.0f;  // +0 whatever up's sign, as the CPU writes it
      continue;
    } else if (g >= 10.0f) {
      gelu = g;
    } else {
      const unsigned short bits = __half_as_ushort(__float2half_rn(g));
      gelu = __half2float(__ushort_as_half(table[bits]));
    }
    y[i] = __fmul_rn(gelu, up[i]);
  }
}

// One block per row: the sum of squares reduced in float (per-thread partial sums, then warp
// shuffles, then one warp over the per-warp sums), y = x * rsqrt(mean + eps) * weight. y may
// alias x: each element is read in the first pass and written only after the block's barrier.
__global__ void RmsNormKernel(const float* x, const float* weight, int64_t n, float eps, float* y) {
  __shared__ float warp_sums[kThreads / 32];
  __shared__ float inv_rms;
  const float* row = x + int64_t(blockIdx.x) * n;
  float* out = y + int64_t(blockIdx.x) * n;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss = fmaf(row[i], row[i], ss);
  for (int offset = 16; offset > 0; offset /= 2) ss += __shfl_down_sync(0xffffffffu, ss, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_sums[warp] = ss;
  __syncthreads();
  if (warp == 0) {
    float total = lane < int(blockDim.x / 32) ? warp_sums[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) {
      total += __shfl_down_sync(0xffffffffu, total, offset);
    }
    if (lane == 0) inv_rms = 1.0f / sqrtf(total / float(n) + eps);
  }
  __syncthreads();
  const float inv = inv_rms;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    out[i] = __fmul_rn(__fmul_rn(row[i], inv), weight[i]);
  }
}

// One thread per rotated pair of x: [n_tokens, n_heads, head_dim]. cos/sin: [n_tokens, n_rot/2].
// NORM pairs (2i, 2i + 1), NEOX pairs (i, i + n_rot / 2); the same FMAs as the CPU's rope_pairs
// (x0 c - x1 s and x0 s + x1 c, the product inside rounded on its own).
__global__ void RopeKernel(float* x, int64_t n_tokens, int64_t n_heads, int32_t head_dim,
                           int32_t half, int32_t neox, const float* cos_table,
                           const float* sin_table) {
  const int64_t total = n_tokens * n_heads * half;
  KILN_GRID_STRIDE(idx, total) {
    const int64_t pair = idx % half;
    const int64_t token_head = idx / half;
    const int64_t token = token_head / n_heads;
    float* a = x + token_head * head_dim + (neox ? pair : 2 * pair);
    const int64_t stride = neox ? half : 1;
    const float c = cos_table[token * half + pair], s = sin_table[token * half + pair];
    const float x0 = a[0], x1 = a[stride];
    a[0] = fmaf(x0, c, -__fmul_rn(x1, s));
    a[stride] = fmaf(x0, s, __fmul_rn(x1, c));
  }
}

// ggml's quantized blocks of 32 elements read here (byte layouts as in GGUF).
struct BlockQ4_0 {
  __half d;
  uint8_t qs[16];
};
struct BlockQ4_1 {
  __half d, m;
  uint8_t qs[16];
};
struct BlockQ8_0 {
  __half d;
  int8_t qs[32];
};
static_assert(sizeof(BlockQ4_0) == 18, "q4_0 block");
static_assert(sizeof(BlockQ4_1) == 20, "q4_1 block");
static_assert(sizeof(BlockQ8_0) == 34, "q8_0 block");

// Element j of a row of `type` (a supported one: the host checks before launching). Products and
// sums rounded on their own (no FMA), as the CPU's scalar dequantizers compute them.
__device__ float DequantElement(uint32_t type, const uint8_t* row, int64_t j) {
  switch (type) {
    case 0:
      return reinterpret_cast<const float*>(row)[j];
    case 1:
      return __half2float(reinterpret_cast<const __half*>(row)[j]);
    case 30:
      return __uint_as_float(uint32_t(reinterpret_cast<const uint16_t*>(row)[j]) << 16);
    case 2: {
      const BlockQ4_0& b = reinterpret_cast<const BlockQ4_0*>(row)[j / 32];
      const int k = int(j % 32);
      const int q = k < 16 ? (b.qs[k] & 0xF) : (b.qs[k - 16] >> 4);
      return __fmul_rn(__half2float(b.d), float(q - 8));
    }
    case 3: {
      const BlockQ4_1& b = reinterpret_cast<const BlockQ4_1*>(row)[j / 32];
      const int k = int(j % 32);
      const int q = k < 16 ? (b.qs[k] & 0xF) : (b.qs[k - 16] >> 4);
      return __fadd_rn(__fmul_rn(__half2float(b.d), float(q)), __half2float(b.m));
    }
    default: {  // 8: Q8_0
      const BlockQ8_0& b = reinterpret_cast<const BlockQ8_0*>(row)[j / 32];
      return __fmul_rn(__half2float(b.d), float(b.qs[j % 32]));
    }
  }
}

// out[t, j] = row tokens[t] of the table, element j. The host has checked every token id.
__global__ void EmbeddingGatherKernel(uint32_t type, const uint8_t* table, int64_t row_bytes,
                                      int64_t n_in, const int32_t* tokens, int64_t n_tokens,
                                      float* out) {
  const int64_t total = n_tokens * n_in;
  KILN_GRID_STRIDE(e, total) {
    const int64_t t = e / n_in, j = e % n_in;
    out[e] = DequantElement(type, table + int64_t(tokens[t]) * row_bytes, j);
  }
}

int Launched(const char* what) { return kiln_cuda::Check(cudaGetLastError(), what); }

using kiln_cuda::Enter;
using kiln_cuda::Fail;

}  // namespace

KILN_CUDA_EXPORT int kiln_cuda_embedding_row_bytes(uint32_t type, int64_t n_in, int64_t* out) {
  if (out == nullptr || n_in < 0) {
    return Fail(KILN_CUDA_INVALID_ARGUMENT, "kiln_cuda_embedding_row_bytes: null out or n_in < 0");
  }
  switch (type) {
    case 0:
      *out = 4 * n_in;
      return KILN_CUDA_OK;
    case 1:
    case 30:
      *out = 2 * n_in;
      return KILN_CUDA_OK;
    case 2:
    case 3:
    case 8:
      if (n_in % 32 != 0) {
        return Fail(KILN_CUDA_INVALID_ARGUMENT,
                    "kiln_cuda_embedding_row_bytes: n_in %lld of a 32-element block type",
                    static_cast<long long>(n_in));
      }
      *out = n_in / 32 * (type == 2 ? 18 : type == 3 ? 20 : 34);
      return KILN_CUDA_OK;
    default:
      return Fail(KILN_CUDA_UNSUPPORTED,
                  "kiln_cuda_embedding_gather: ggml type %u has no device dequantizer", type);
  }
}

KILN_CUDA_EXPORT int kiln_cuda_rms_norm(const float* x, const float* weight, int64_t n_rows,
                                        int64_t n, float eps, float* y, kiln_cuda_stream stream) {
  if (n_rows < 0 || n_rows > INT_MAX || n < 0) {
    return Fail(KILN_CUDA_INVALID_ARGUMENT, "kiln_cuda_rms_norm: n_rows %lld, n %lld",
                static_cast<long long>(n_rows), static_cast<long long>(n));
  }
  if (n_rows == 0 || n == 0) return KILN_CUDA_OK;
  if (x == nullptr || weight == nullptr || y == nullptr) {
    return Fail(KILN_CUDA_INVALID_ARGUMENT, "kiln_cuda_rms_norm: null buffer");
  }
  if (const int rc = Enter(stream, "kiln_cuda_rms_norm"); rc != KILN_CUDA_OK) return rc;
  RmsNormKernel<<<unsigned(n_rows), kThreads, 0, stream->stream>>>(x, weight, n, eps, y);
  return Launched("kiln_cuda_rms_norm: launch");
}

KILN_CUDA_EXPORT int kiln_cuda_add(const float* a, const float* b, int64_t n, float* y,
                                   kiln_cuda_stream stream) {
  if (n < 0) return Fail(KILN_CUDA_INVALID_ARGUMENT, "kiln_cuda_add: n < 0");
  if (n == 0) return KILN_CUDA_OK;
  if (a == nullptr || b == nullptr || y == nullptr) {
    return Fail(KILN_CUDA_INVALID_ARGUMENT, "kiln_cuda_add: null buffer");
  }
  if (const int rc = Enter(stream, "kiln_cuda_add"); rc != KILN_CUDA_OK) return rc;
  AddKernel<<<BlocksFor(n), kThreads, 0, stream->stream>>>(a, b, n, y);
  return Launched("kiln_cuda_add: launch");
}

KILN_CUDA_EXPORT int kiln_cuda_add_row_bias(float* x, const float* bias, int64_t n_rows, int64_t n,
                                            kiln_cuda_stream stream) {
  if (n_rows < 0 || n < 0) return Fail(KILN_CUDA_INVALID_ARGUMENT, "kiln_cuda_add_row_bias: n < 0");
  if (n_rows == 0 || n == 0) return KILN_CUDA_OK;
  if (x == nullptr || bias == nullptr) {
    return Fail(KILN_CUDA_INVALID_ARGUMENT, "kiln_cuda_add_row_bias: null buffer");
  }
  if (const int rc = Enter(stream, "kiln_cuda_add_row_bias"); rc != KILN_CUDA_OK) return rc;
  AddRowBiasKernel<<<BlocksFor(n_rows * n), kThreads, 0, stream->stream>>>(x, bias, n_rows * n, n);
  return Launched("kiln_cuda_add_row_bias: launch");
}

KILN_CUDA_EXPORT int kiln_cuda_swiglu(const float* gate, const float* up, int64_t n, float* y,
                                      kiln_cuda_stream stream) {
  if (n < 0) return Fail(KILN_CUDA_INVALID_ARGUMENT, "kiln_cuda_swiglu: n < 0");
  if (n == 0) return KILN_CUDA_OK;
  if (gate == nullptr || up == nullptr || y == nullptr) {
    return Fail(KILN_CUDA_INVALID_ARGUMENT, "kiln_cuda_swiglu: null buffer");
  }
  if (const int rc = Enter(stream, "kiln_cuda_swiglu"); rc != KILN_CUDA_OK) return rc;
  SwiGluKernel<<<BlocksFor(n), kThreads, 0, stream->stream>>>(gate, up, n, y);
  return Launched("kiln_cuda_swiglu: launch");
}

KILN_CUDA_EXPORT int kiln_cuda_geglu(const float* gate, const float* up, int64_t n,
                                     const uint16_t* gelu_f16_table, float* y,
                                     kiln_cuda_stream stream) {
  if (n < 0) return Fail(KILN_CUDA_INVALID_ARGUMENT, "kiln_cuda_geglu: n < 0");
  if (n == 0) return KILN_CUDA_OK;
  if (gate == nullptr || up == nullptr || y == nullptr || gelu_f16_table == nullptr) {
    return Fail(KILN_CUDA_INVALID_ARGUMENT, "kiln_cuda_geglu: null buffer or table");
  }
  if (const int rc = Enter(stream, "kiln_cuda_geglu"); rc != KILN_CUDA_OK) return rc;
  GeGluKernel<<<BlocksFor(n), kThreads, 0, stream->stream>>>(gate, up, n, gelu_f16_table, y);
  return Launched("kiln_cuda_geglu: launch");
}

KILN_CUDA_EXPORT int kiln_cuda_scale(float* x, int64_t n, float s, kiln_cuda_stream stream) {
  if (n < 0) return Fail(KILN_CUDA_INVALID_ARGUMENT, "kiln_cuda_scale: n < 0");
  if (n == 0) return KILN_CUDA_OK;
  if (x == nullptr) return Fail(KILN_CUDA_INVALID_ARGUMENT, "kiln_cuda_scale: null buffer");
  if (const int rc = Enter(stream, "kiln_cuda_scale"); rc != KILN_CUDA_OK) return rc;
  ScaleKernel<<<BlocksFor(n), kThreads, 0, stream->stream>>>(x, n, s);
  return Launched("kiln_cuda_scale: launch");
}

KILN_CUDA_EXPORT int kiln_cuda_rope_rotate(float* x, int64_t n_tokens, int64_t n_heads,
                                           int32_t head_dim, int32_t n_rot, int32_t neox,
                                           const float* cos_table, const float* sin_table,
                                           kiln_cuda_stream stream) {
  if (n_tokens < 0 || n_heads < 0 || n_rot < 2 || n_rot % 2 != 0 || n_rot > head_dim) {
    return Fail(KILN_CUDA_INVALID_ARGUMENT,
                "kiln_cuda_rope_rotate: n_tokens %lld, n_heads %lld, head_dim %d, n_rot %d",
                static_cast<long long>(n_tokens), static_cast<long long>(n_heads), head_dim, n_rot);
  }
  if (n_tokens == 0 || n_heads == 0) return KILN_CUDA_OK;
  if (x == nullptr || cos_table == nullptr || sin_table == nullptr) {
    return Fail(KILN_CUDA_INVALID_ARGUMENT, "kiln_cuda_rope_rotate: null buffer or table");
  }
  if (const int rc = Enter(stream, "kiln_cuda_rope_rotate"); rc != KILN_CUDA_OK) return rc;
  const int32_t half = n_rot / 2;
  RopeKernel<<<BlocksFor(n_tokens * n_heads * half), kThreads, 0, stream->stream>>>(
      x, n_tokens, n_heads, head_dim, half, neox != 0, cos_table, sin_table);
  return Launched("kiln_cuda_rope_rotate: launch");
}

KILN_CUDA_EXPORT int kiln_cuda_embedding_gather(uint32_t type, const void* table, int64_t n_in,
                                                const int32_t* tokens, int64_t n_tokens, float* out,
                                                kiln_cuda_stream stream) {
  int64_t row_bytes = 0;
  if (const int rc = kiln_cuda_embedding_row_bytes(type, n_in, &row_bytes); rc != KILN_CUDA_OK) {
    return rc;
  }
  if (n_tokens < 0) return Fail(KILN_CUDA_INVALID_ARGUMENT, "kiln_cuda_embedding_gather: n < 0");
  if (n_tokens == 0 || n_in == 0) return KILN_CUDA_OK;
  if (table == nullptr || tokens == nullptr || out == nullptr) {
    return Fail(KILN_CUDA_INVALID_ARGUMENT, "kiln_cuda_embedding_gather: null buffer");
  }
  if (const int rc = Enter(stream, "kiln_cuda_embedding_gather"); rc != KILN_CUDA_OK) return rc;
  EmbeddingGatherKernel<<<BlocksFor(n_tokens * n_in), kThreads, 0, stream->stream>>>(
      type, static_cast<const uint8_t*>(table), row_bytes, n_in, tokens, n_tokens, out);
  return Launched("kiln_cuda_embedding_gather: launch");
}
