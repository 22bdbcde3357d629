// AVX-512 row kernels of the activation quantizers (rules: lib/quant/activation.h). Same bytes
// as the scalar forms: |x * id| <= 127 always, so the saturating narrowing never clips.
//
// Blocks go in groups of 16: each block's amax is a reduction of its own, but the two divisions
// (d = amax / 127, id = 127 / amax) and the f16 conversions of d (and of s = d * Σ q for Q8_1)
// run as one vector per group, where one block at a time spent most of its time in two scalar
// divisions and two software f16 roundings.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/f16_avx512.h"
#include "kernels/cpu/legacy.h"

namespace kiln::quant {
namespace {

template <typename Block>
void QuantizeRow(const float* x, void* vy, int64_t n) {
  constexpr bool kHasSum = sizeof(Block) == sizeof(BlockQ8_1);
  auto* y = static_cast<Block*>(vy);
  const int64_t nb = n / kQK;
  for (int64_t b0 = 0; b0 < nb; b0 += 16) {
    const int g = nb - b0 < 16 ? static_cast<int>(nb - b0) : 16;
    const float* xg = x + b0 * kQK;
    alignas(64) float amax[16] = {};
    for (int j = 0; j < g; ++j) {
      const __m512 v0 = _mm512_loadu_ps(xg + j * kQK), v1 = _mm512_loadu_ps(xg + j * kQK + 16);
      amax[j] = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    }
    const __m512 a = _mm512_load_ps(amax);
    const __m512 d = _mm512_div_ps(a, _mm512_set1_ps(127.0f));
    // id = amax != 0 ? 127 / amax : 0 (a NaN amax is "!= 0", as in the scalar form).
    const __mmask16 nonzero = _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_NEQ_UQ);
    alignas(64) float id[16];
    _mm512_store_ps(id, _mm512_maskz_div_ps(nonzero, _mm512_set1_ps(127.0f), a));
    alignas(64) int32_t sum[16] = {};
    for (int j = 0; j < g; ++j) {
      const __m512 idv = _mm512_set1_ps(id[j]);
      // cvtps rounds with MXCSR's mode: to nearest, ties to even.
      const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xg + j * kQK), idv));
      const __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xg + j * kQK + 16), idv));
      if constexpr (kHasSum) sum[j] = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
      int8_t* q = y[b0 + j].qs;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtsepi32_epi8(i0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtsepi32_epi8(i1));
    }
    alignas(32) uint16_t dh[16], sh[16];
    _mm256_store_si256(reinterpret_cast<__m256i*>(dh), F16OfLanesAvx512(d));
    if constexpr (kHasSum) {
      const __m512 s = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_load_si512(sum)));
      _mm256_store_si256(reinterpret_cast<__m256i*>(sh), F16OfLanesAvx512(s));
    }
    for (int j = 0; j < g; ++j) {
      std::memcpy(y[b0 + j].d, &dh[j], 2);
      if constexpr (kHasSum) std::memcpy(y[b0 + j].s, &sh[j], 2);
    }
  }
}

}  // namespace

void QuantizeActivationQ8_0Avx512(const float* x, void* y, int64_t n) {
  QuantizeRow<BlockQ8_0>(x, y, n);
}
void QuantizeActivationQ8_1Avx512(const float* x, void* y, int64_t n) {
  QuantizeRow<BlockQ8_1>(x, y, n);
}

}  // namespace kiln::quant
