// Quantized GEMV for batch-1 (and few-token) decode: one warp per output row. The warp's lanes
// take the row's 32-element units in turn (lane l: units l, l + 32, ...), so the lanes of a warp
// read neighbouring bytes of the row together; each lane decodes its unit in f32 and accumulates
// in f32, then the warp sums its lanes. Activations stay f32 (no int8 dot products): the bound
// against the CPU is f32 rounding of the same decoded weights, see tests/unit/cuda_kernels_test.cc.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_abi.h"
#include "kernels/cuda/gemv_units.h"
#include "kernels/cuda/module_util.h"
#include "kernels/cuda/quant_decode.cuh"

namespace kiln::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kMaxTokens = 8;

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// A lane's unit of work: kElems consecutive elements of a row. Decode(row, u, w) writes unit
// u's weights to w[0 .. kElems): element by element with byte loads (ElementUnit, any type), or
// a word at a time for the types gemv_units.h has (LaunchGemv checks the alignment, kAlign bytes,
// that those need).
template <uint32_t kType>
struct ElementUnit {  // any type: element by element, byte loads
  using B = Block<kType>;
  static constexpr int kElems = B::kElems >= 32 ? 32 : 1;
  __device__ static void Decode(const uint8_t* row, int64_t u, float* w) {
    const int64_t first = u * kElems;
    const uint8_t* block = row + first / B::kElems * B::kBytes;
    const int e0 = static_cast<int>(first % B::kElems);
#pragma unroll
    for (int e = 0; e < kElems; ++e) w[e] = B::Decode(block, e0 + e);
  }
};

template <uint32_t kType>
struct Unit : ElementUnit<kType> {
  static constexpr int kAlign = 1;
};

template <>
struct Unit<kTypeF16> : WordUnit<kTypeF16> {};
template <>
struct Unit<kTypeQ4_1> : WordUnit<kTypeQ4_1> {};
template <>
struct Unit<kTypeQ8_0> : WordUnit<kTypeQ8_0> {};
template <>
struct Unit<kTypeQ4_K> : WordUnit<kTypeQ4_K> {};

// U: the unit decoder (Unit<kType> or ElementUnit<kType>).
template <uint32_t kType, typename U, bool kVector>
__global__ void GemvKernel(const uint8_t* __restrict__ w, int64_t n_out, int64_t n_in,
                           const float* __restrict__ x, int n_tokens, float* __restrict__ y) {
  constexpr int kUnit = U::kElems;
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= n_out) return;  // whole warps leave together: no shuffle sees a missing lane
  const int64_t row_bytes = n_in / Block<kType>::kElems * Block<kType>::kBytes;
  const uint8_t* w_row = w + row * row_bytes;
  float acc[kMaxTokens] = {};
  const int64_t n_units = n_in / kUnit;
  for (int64_t u = lane; u < n_units; u += 32) {
    float wv[kUnit];
    U::Decode(w_row, u, wv);
    const int64_t first = u * kUnit;
#pragma unroll
    for (int t = 0; t < kMaxTokens; ++t) {
      if (t < n_tokens) {
        const float* xt = x + t * n_in + first;
        if constexpr (kVector) {
#pragma unroll
          for (int e = 0; e < kUnit; e += 4) {
            const float4 xv = *reinterpret_cast<const float4*>(xt + e);
            acc[t] += wv[e] * xv.x;
            acc[t] += wv[e + 1] * xv.y;
            acc[t] += wv[e + 2] * xv.z;
            acc[t] += wv[e + 3] * xv.w;
          }
        } else {
#pragma unroll
          for (int e = 0; e < kUnit; ++e) acc[t] += wv[e] * xt[e];
        }
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kMaxTokens; ++t) {
    if (t < n_tokens) {
      const float sum = WarpSum(acc[t]);
      if (lane == 0) y[t * n_out + row] = sum;
    }
  }
}

template <uint32_t kType>
int LaunchGemv(const void* w, int64_t n_out, int64_t n_in, const float* x, int64_t n_tokens,
               float* y, cudaStream_t stream) {
  if (n_in % Block<kType>::kElems != 0) {
    return kiln_cuda::Fail(KILN_CUDA_INVALID_ARGUMENT,
                           "kiln_cuda_gemv: n_in %lld is not a multiple of the type's block (%d)",
                           static_cast<long long>(n_in), Block<kType>::kElems);
  }
  const int64_t blocks = (n_out + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > 0x7fffffff) {
    return kiln_cuda::Fail(KILN_CUDA_INVALID_ARGUMENT, "kiln_cuda_gemv: n_out %lld too large",
                           static_cast<long long>(n_out));
  }
  const auto* wb = static_cast<const uint8_t*>(w);
  const unsigned grid = static_cast<unsigned>(blocks), threads = 32 * kWarpsPerBlock;
  // The unit decoders' loads need d_w aligned, whole units per row and (f16: 8 elements) rows
  // that keep the alignment; float4 loads of x need its rows 16-byte aligned. Else the element
  // by element kernel (the same values, one byte at a time).
  using U = Unit<kType>;
  const bool units_fit = n_in % U::kElems == 0 && reinterpret_cast<uintptr_t>(w) % U::kAlign == 0 &&
                         (n_in / Block<kType>::kElems * Block<kType>::kBytes) % U::kAlign == 0;
  const bool x_vector =
      U::kElems % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && n_in % 4 == 0;
  const int nt = static_cast<int>(n_tokens);
  if (units_fit && x_vector) {
    GemvKernel<kType, U, true><<<grid, threads, 0, stream>>>(wb, n_out, n_in, x, nt, y);
  } else if (units_fit) {
    GemvKernel<kType, U, false><<<grid, threads, 0, stream>>>(wb, n_out, n_in, x, nt, y);
  } else {
    GemvKernel<kType, ElementUnit<kType>, false>
        <<<grid, threads, 0, stream>>>(wb, n_out, n_in, x, nt, y);
  }
  return kiln_cuda::Check(cudaGetLastError(), "kiln_cuda_gemv: launch");
}

}  // namespace
}  // namespace kiln::cuda

KILN_CUDA_EXPORT int kiln_cuda_gemv(uint32_t type, const void* d_w, int64_t n_out, int64_t n_in,
                                    const float* d_x, int64_t n_tokens, float* d_y,
                                    kiln_cuda_stream stream) {
  using namespace kiln::cuda;
  if (d_w == nullptr || d_x == nullptr || d_y == nullptr || n_out <= 0 || n_in <= 0 ||
      n_tokens < 1 || n_tokens > kMaxTokens) {
    return kiln_cuda::Fail(KILN_CUDA_INVALID_ARGUMENT,
                           "kiln_cuda_gemv: null pointer or shape out of range (n_out %lld, n_in "
                           "%lld, n_tokens %lld; n_tokens must be 1..%d)",
                           static_cast<long long>(n_out), static_cast<long long>(n_in),
                           static_cast<long long>(n_tokens), kMaxTokens);
  }
  if (const int rc = kiln_cuda::Enter(stream, "kiln_cuda_gemv"); rc != KILN_CUDA_OK) return rc;
  cudaStream_t s = stream->stream;
  switch (type) {
    case kTypeF16:
      return LaunchGemv<kTypeF16>(d_w, n_out, n_in, d_x, n_tokens, d_y, s);
    case kTypeQ4_1:
      return LaunchGemv<kTypeQ4_1>(d_w, n_out, n_in, d_x, n_tokens, d_y, s);
    case kTypeQ5_0:
      return LaunchGemv<kTypeQ5_0>(d_w, n_out, n_in, d_x, n_tokens, d_y, s);
    case kTypeQ8_0:
      return LaunchGemv<kTypeQ8_0>(d_w, n_out, n_in, d_x, n_tokens, d_y, s);
    case kTypeQ4_K:
      return LaunchGemv<kTypeQ4_K>(d_w, n_out, n_in, d_x, n_tokens, d_y, s);
    case kTypeQ6_K:
      return LaunchGemv<kTypeQ6_K>(d_w, n_out, n_in, d_x, n_tokens, d_y, s);
    default:
      return kiln_cuda::Fail(KILN_CUDA_UNSUPPORTED, "kiln_cuda_gemv: no kernel for ggml type %u",
                             type);
  }
}

// The GEMV switch above and kiln_cuda_dequantize_f16 (gemm.cu) read the same six types.
KILN_CUDA_EXPORT int kiln_cuda_matmul_caps(uint32_t type, int32_t* gemv_max_tokens, int32_t* gemm) {
  using namespace kiln::cuda;
  if (gemv_max_tokens == nullptr || gemm == nullptr) {
    return kiln_cuda::Fail(KILN_CUDA_INVALID_ARGUMENT, "kiln_cuda_matmul_caps: null output");
  }
  const bool known = type == kTypeF16 || type == kTypeQ4_1 || type == kTypeQ5_0 ||
                     type == kTypeQ8_0 || type == kTypeQ4_K || type == kTypeQ6_K;
  *gemv_max_tokens = known ? kMaxTokens : 0;
  *gemm = known ? 1 : 0;
  return KILN_CUDA_OK;
}
