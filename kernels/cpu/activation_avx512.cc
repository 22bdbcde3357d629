// AVX-512 activation quantizers (contract and rounding rules: lib/quant/activation.h). Same
// bytes as the scalar forms: |x * id| <= 127 always, so the saturating narrowing never clips.
#include <immintrin.h>

#include "lib/quant/activation.h"
#include "lib/quant/legacy_kernels.h"

namespace kiln::quant {
namespace {

// Quantizes 32 floats into q; returns d; *sum = sum of q.
inline float QuantizeBlock(const float* x, int8_t* q, int32_t* sum) {
  const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  const float d = amax / 127.0f;
  const __m512 id = _mm512_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
  // cvtps rounds with MXCSR's mode: to nearest, ties to even.
  const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, id));
  const __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, id));
  *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtsepi32_epi8(i0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtsepi32_epi8(i1));
  return d;
}

}  // namespace

void QuantizeActivationQ8_0Avx512(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<BlockQ8_0*>(vy);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    int32_t sum;
    StoreHalf(y[i].d, QuantizeBlock(x, y[i].qs, &sum));
  }
}

void QuantizeActivationQ8_1Avx512(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<BlockQ8_1*>(vy);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    int32_t sum;
    const float d = QuantizeBlock(x, y[i].qs, &sum);
    StoreHalf(y[i].d, d);
    StoreHalf(y[i].s, d * static_cast<float>(sum));
  }
}

}  // namespace kiln::quant
