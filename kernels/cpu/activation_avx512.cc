// AVX-512 block kernel of the activation quantizers (rules: lib/quant/activation.h). Same
// bytes as the scalar forms: |x * id| <= 127 always, so the saturating narrowing never clips.
#include <immintrin.h>

#include "lib/quant/activation.h"

namespace kiln::quant {

float QuantizeActivationBlockAvx512(const float* x, int8_t* q, int32_t* sum) {
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

}  // namespace kiln::quant
